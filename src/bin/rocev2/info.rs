//! `rocev2 info`: backends, RDMA devices, ports and GID tables.

use crate::{Exit, Outcome};

pub fn run() -> Outcome {
    outln!("rocev2 {} (C ABI {})", rocev2::VERSION, rocev2::ABI_VERSION)?;
    outln!("backend soft: built in (userspace RoCEv2 over UDP; device name \"soft\")")?;
    if rocev2::soft::raw_capture_allowed() {
        outln!("  received ICRCs: checked (raw capture allowed: CAP_NET_RAW)")?;
    } else {
        outln!(
            "  received ICRCs: not checked (no CAP_NET_RAW; `setcap cap_net_raw+ep` the program \
             or run as root to check them)"
        )?;
    }
    #[cfg(feature = "verbs")]
    {
        outln!("backend verbs: built in (libibverbs.so.1, loaded at run time)")?;
        let devices = match rocev2::verbs::load_library() {
            Ok(()) => rocev2::verbs::list_devices(),
            Err(e) => {
                outln!("  {e}")?;
                return Ok(Exit::Ok);
            }
        };
        if devices.is_empty() {
            outln!(
                "  No RDMA devices found on this host: no RoCE NIC driver is loaded and no \
                 Soft-RoCE device exists.\n  To create one: `modprobe rdma_rxe && rdma link add \
                 rxe0 type rxe netdev <iface>` (needs a kernel with rdma_rxe), or use the soft backend."
            )?;
        }
        for d in devices {
            match d {
                Ok(d) => {
                    outln!(
                        "  device {}  fw {}  max_qp_wr {}  {}",
                        d.name,
                        d.fw_ver,
                        d.max_qp_wr,
                        match d.completion_clock_khz {
                            Some(khz) => format!(
                                "completion timestamps (NIC clock {:.2} MHz): frames carry the \
                                 NIC's receive time",
                                khz as f64 / 1000.0
                            ),
                            None => "no completion timestamps: frames carry the host clock at \
                                     poll"
                                .to_string(),
                        }
                    )?;
                    for p in d.ports {
                        outln!(
                            "    port {}  {}  active_mtu {}",
                            p.port,
                            p.state,
                            p.active_mtu
                        )?;
                        for g in p.gids {
                            let ip = g.gid.ipv4().map(|i| format!("  ({i})")).unwrap_or_default();
                            outln!("      gid[{:>3}] {}  {}{}", g.index, g.gid, g.kind, ip)?;
                        }
                    }
                }
                Err(e) => outln!("  device error: {e}")?,
            }
        }
    }
    #[cfg(not(feature = "verbs"))]
    outln!("backend verbs: not built (enable the `verbs` feature)")?;
    Ok(Exit::Ok)
}
