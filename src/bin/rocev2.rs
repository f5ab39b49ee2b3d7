//! `rocev2` command-line tool.
//!
//!   rocev2 info       backends, RDMA devices, ports and GID tables
//!   rocev2 version    library and ABI version

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: rocev2 <command>\n\n\
         commands:\n  \
         info      list the backends, the RDMA devices, their ports and GID tables\n  \
         version   print the library and C ABI versions\n\n\
         Logging: RUST_LOG=info (or debug, trace)."
    );
    ExitCode::from(2)
}

fn info() -> ExitCode {
    println!("rocev2 {} (C ABI {})", rocev2::VERSION, rocev2::ABI_VERSION);
    #[cfg(feature = "verbs")]
    {
        println!("backend verbs: built in (libibverbs)");
        let devices = rocev2::verbs::list_devices();
        if devices.is_empty() {
            println!(
                "  No RDMA devices found on this host: no RoCE NIC driver is loaded and no \
                 Soft-RoCE device exists.\n  To create one: `modprobe rdma_rxe && rdma link add \
                 rxe0 type rxe netdev <iface>` (needs a kernel with rdma_rxe)."
            );
        }
        for d in devices {
            match d {
                Ok(d) => {
                    println!(
                        "  device {}  fw {}  max_qp_wr {}",
                        d.name, d.fw_ver, d.max_qp_wr
                    );
                    for p in d.ports {
                        println!(
                            "    port {}  {}  active_mtu {}",
                            p.port, p.state, p.active_mtu
                        );
                        for g in p.gids {
                            let ip = g.gid.ipv4().map(|i| format!("  ({i})")).unwrap_or_default();
                            println!("      gid[{:>3}] {}  {}{}", g.index, g.gid, g.kind, ip);
                        }
                    }
                }
                Err(e) => println!("  device error: {e}"),
            }
        }
    }
    #[cfg(not(feature = "verbs"))]
    println!("backend verbs: not built (enable the `verbs` feature)");
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("info") => info(),
        Some("version") | Some("--version") => {
            println!("rocev2 {} (C ABI {})", rocev2::VERSION, rocev2::ABI_VERSION);
            ExitCode::SUCCESS
        }
        _ => usage(),
    }
}
