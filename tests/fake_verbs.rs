//! A libibverbs that misbehaves (issue 38 finding 6): `ibv_get_device_name`
//! returning NULL, and a device count (`*num`) larger than the list before
//! its NULL terminator. `rocev2 info` and `recv --device` died by SIGSEGV in
//! `DeviceList::devices`. The library here is built by the test (cc) from
//! the source below, with the symbol versions rdma-core's has, and found
//! through LD_LIBRARY_PATH as `libibverbs.so.1`: it stands in for a broken
//! install, the real code path reads it.

#![cfg(feature = "verbs")]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Two devices and the NULL terminator; the first has no name, and the
/// count says 5. Every other verb fails (NULL or -1).
const FAKE: &str = r#"
#include <stddef.h>
struct ibv_device;
static char devs[2][64];
static struct ibv_device *list[3] = {(struct ibv_device *)devs[0], (struct ibv_device *)devs[1], NULL};
struct ibv_device **ibv_get_device_list(int *num) { if (num) *num = 5; return list; }
void ibv_free_device_list(struct ibv_device **l) { (void)l; }
const char *ibv_get_device_name(struct ibv_device *d) {
    return d == (struct ibv_device *)devs[0] ? NULL : "fake1";
}
#define NULLS(name) void *name(void) { return NULL; }
#define FAILS(name) int name(void) { return -1; }
NULLS(ibv_open_device) FAILS(ibv_close_device) FAILS(ibv_query_device) FAILS(ibv_query_port)
FAILS(ibv_query_gid) NULLS(ibv_alloc_pd) FAILS(ibv_dealloc_pd) NULLS(ibv_reg_mr)
FAILS(ibv_dereg_mr) NULLS(ibv_create_comp_channel) FAILS(ibv_destroy_comp_channel)
FAILS(ibv_get_cq_event) void ibv_ack_cq_events(void) {} NULLS(ibv_create_cq) FAILS(ibv_destroy_cq)
NULLS(ibv_create_qp) FAILS(ibv_modify_qp) FAILS(ibv_destroy_qp)
const char *ibv_port_state_str(int s) { (void)s; return "?"; }
const char *ibv_wc_status_str(int s) { (void)s; return "?"; }
"#;

const VERSIONS: &str = "IBVERBS_1.0 { global: ibv_create_comp_channel; ibv_destroy_comp_channel; };
IBVERBS_1.1 { global: ibv_*; local: *; } IBVERBS_1.0;
";

/// Builds the fake library into a directory of its own; returns the directory.
fn build_fake() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rocev2-fake-verbs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, map) = (dir.join("fake.c"), dir.join("fake.map"));
    std::fs::write(&src, FAKE).unwrap();
    std::fs::write(&map, VERSIONS).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libibverbs.so.1"))
        .arg(&src)
        .arg(format!("-Wl,--version-script={}", map.display()))
        .output()
        .expect("cc (the build host's C compiler)");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn cli(fake: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rocev2"))
        .args(args)
        .env("LD_LIBRARY_PATH", fake)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn a_device_without_a_name_and_an_overstated_count_are_survived() {
    let fake = build_fake();
    let info = cli(&fake, &["info"]);
    let (out, err) = (
        String::from_utf8_lossy(&info.stdout),
        String::from_utf8_lossy(&info.stderr),
    );
    assert!(
        info.status.code().is_some(),
        "rocev2 info died by a signal ({:?}): {err}",
        info.status
    );
    assert!(out.contains("fake1"), "the named device listed: {out}");
    // One device tried (fake1, which this library cannot open): the one
    // without a name left out, nothing read past the NULL terminator.
    assert_eq!(
        out.matches("RDMA device '").count(),
        1,
        "only fake1 listed: {out}"
    );
    assert!(
        err.contains("no name"),
        "the nameless device is warned: {err}"
    );
    let recv = cli(
        &fake,
        &[
            "recv",
            "--device",
            "fake1",
            "--fpga-ip",
            "127.0.0.1",
            "--fpga-qpn",
            "-",
        ],
    );
    let err = String::from_utf8_lossy(&recv.stderr);
    assert!(
        recv.status.code().is_some_and(|c| c != 0),
        "recv --device died by a signal or succeeded ({:?}): {err}",
        recv.status
    );
    let _ = std::fs::remove_dir_all(&fake);
}
