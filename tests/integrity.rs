//! What happened to each frame (issue 36), end to end over loopback: the
//! soft backend stamps every frame with the kernel's receive time of its
//! last packet.

use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rocev2::emulator::{pattern, EmulatorConfig, FpgaEmulator};
use rocev2::{ConnectParams, Device, DeviceConfig, Frame, Mtu, RxTimeSource, Server, ServerConfig};

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Every frame carries the kernel's receive stamp (source Kernel), taken
/// after the emulator started sending it and before the callback saw it,
/// never decreasing, with latency measurement off (and then no delivery
/// latency is recorded: the stamps alone do not feed the histogram).
#[test]
fn soft_frames_carry_the_kernels_receive_stamp() {
    let dev = Device::open(&DeviceConfig::soft_ephemeral("127.0.0.1")).unwrap();
    let server = Server::create(
        &dev,
        &ServerConfig {
            max_payload: 4096,
            rx_queue_depth: 64,
            spin_us: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let hp = server.host_params();
    // 256-byte packets: most frames are several, stamped by their last.
    let mut ecfg = EmulatorConfig::for_server(&hp).unwrap();
    ecfg.pmtu = Mtu::Mtu256;
    let mut emu = FpgaEmulator::new(ecfg).unwrap();
    server.set_fpga_gid(emu.gid()).unwrap();
    let (tx, rx) = mpsc::channel();
    server
        .set_frame_callback(move |f: Frame| {
            tx.send((f.rx_time_ns(), f.rx_time_source(), now_ns()))
                .unwrap();
        })
        .unwrap();
    server
        .complete_connection(&ConnectParams::new(emu.qpn(), hp.sq_psn, 1, 12).unwrap())
        .unwrap();
    let n = 200;
    let before = now_ns();
    for i in 0..n {
        emu.submit(pattern::make(i, 100 + i as usize * 10), 0);
    }
    emu.run_until_idle(Duration::from_secs(30)).unwrap();
    let mut last = 0;
    for i in 0..n {
        let (at, src, seen) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(src, RxTimeSource::Kernel, "frame {i}");
        assert!(
            before <= at && at <= seen,
            "frame {i}: {before} <= {at} <= {seen}"
        );
        assert!(at >= last, "frame {i}: {at} after {last}");
        last = at;
    }
    assert_eq!(server.stats().delivery_latency.count, 0);
    server.stop();
}
