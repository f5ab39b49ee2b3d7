//! The receive thread is listed under its name as soon as
//! `complete_connection` returns (rogue looks for it right away). Its own
//! binary: no other test's server thread runs in this process.

use rocev2::{ConnectParams, Device, DeviceConfig, Server, ServerConfig};

/// The names of this process's threads, from /proc/self/task/*/comm.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim_end().to_string())
        .collect()
}

#[test]
fn receive_thread_is_named_when_complete_connection_returns() {
    let dev = Device::open(&DeviceConfig::soft_ephemeral("127.0.0.1")).unwrap();
    for run in 0..20 {
        let server = Server::create(&dev, &ServerConfig::default()).unwrap();
        server.set_fpga_gid(dev_gid()).unwrap();
        let before = count(&thread_names());
        let hp = server.host_params();
        server
            .complete_connection(&ConnectParams::new(0x12, hp.sq_psn, 5, 1).unwrap())
            .unwrap();
        let names = thread_names();
        assert_eq!(
            count(&names),
            before + 1,
            "run {run}: no new RoCEv2Server thread right after complete_connection: {names:?}"
        );
        server.stop();
    }
}

fn count(names: &[String]) -> usize {
    names.iter().filter(|n| *n == "RoCEv2Server").count()
}

/// The FPGA's address: loopback.
fn dev_gid() -> rocev2::Gid {
    rocev2::Gid::from_ipv4(std::net::Ipv4Addr::LOCALHOST)
}
