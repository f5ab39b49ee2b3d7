//! A complete Rust consumer: a soft-backend server receives frames through
//! the callback API while the library's FPGA emulator streams to it over
//! loopback (in this process, on another thread); every frame's pattern and
//! channel are checked.
//!
//!     cargo run --release --example stream [frames] [size]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocev2::emulator::{EmulatorConfig, FpgaEmulator};
use rocev2::{ConnectParams, Device, DeviceConfig, Gid, Server, ServerConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>());
    let frames = args.next().transpose()?.unwrap_or(10_000);
    let size = args.next().transpose()?.unwrap_or(4096) as usize;

    // The soft backend on 127.0.0.1, any free port, ACKs to each packet's
    // source port; an RDMA NIC: DeviceConfig::from(VerbsConfig { gid_index, ..VerbsConfig::new("mlx5_0") }).
    let dev = Device::open(&DeviceConfig::soft_ephemeral("127.0.0.1"))?;
    let server = Server::create(
        &dev,
        &ServerConfig {
            max_payload: 4096,
            rx_queue_depth: 64,
            ..ServerConfig::default()
        },
    )?;
    server.set_fpga_gid(Gid::parse("127.0.0.1")?)?;
    let hp = server.host_params(); // program the FPGA with these

    let (received, bad) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (r, b) = (received.clone(), bad.clone());
    server.set_frame_callback(move |frame| {
        // frame.data(): zero copy, in the slab; the slot is re-posted when `frame` drops.
        let want = r.fetch_add(1, Ordering::SeqCst);
        match rocev2::emulator::pattern::check(frame.data()) {
            Ok(seq) if seq == want && u64::from(frame.channel()) == seq % 4 => {}
            _ => {
                b.fetch_add(1, Ordering::SeqCst);
            }
        }
    })?;

    let mut fpga = FpgaEmulator::new(EmulatorConfig::for_server(&hp)?)?;
    server.complete_connection(&ConnectParams::new(fpga.qpn(), hp.sq_psn, 5, 12)?)?;
    let emu = std::thread::spawn(move || {
        fpga.stream(
            frames,
            size,
            &[0, 1, 2, 3],
            64,
            Duration::from_secs(120),
            |_| {},
        )
    });
    emu.join().expect("emulator thread")?; // every frame acknowledged
    let t0 = Instant::now(); // an ACK precedes the callback: let the last ones run
    while received.load(Ordering::SeqCst) < frames && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (got, bad) = (received.load(Ordering::SeqCst), bad.load(Ordering::SeqCst));
    println!(
        "stream (Rust): {got} of {frames} frames, {} bytes, {bad} out of order",
        server.stats().bytes
    );
    if got != frames || bad != 0 {
        return Err("frames missing or out of order".into());
    }
    Ok(())
}
