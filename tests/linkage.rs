//! The built library and CLI carry no DT_NEEDED on libibverbs or librdmacm:
//! the verbs backend loads libibverbs.so.1 at run time (src/verbs/dl.rs), so
//! a host without rdma-core can load them. rdma-sys's build script still puts
//! `-libverbs -lrdmacm` on the link line; rustc links with `--as-needed`, so
//! they stay out as long as nothing calls an rdma-sys function. A call that
//! slips in (an `ibv_*` from rdma-sys instead of the loaded table) fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The DT_NEEDED entries of `file`, from `readelf -d` (binutils: present
/// wherever a C linker is).
fn needed(file: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(file)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running `readelf -d {}`: {e} (install binutils)",
                file.display()
            )
        });
    assert!(
        out.status.success(),
        "readelf -d {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split_once('[')?.1.trim_end_matches(']').to_string()))
        .collect()
}

fn check(file: &Path) {
    let libs = needed(file);
    assert!(
        libs.iter().any(|l| l.starts_with("libc.so")),
        "{}: no libc among {libs:?}: readelf output not understood",
        file.display()
    );
    for l in &libs {
        assert!(
            !l.starts_with("libibverbs") && !l.starts_with("librdmacm"),
            "{} has DT_NEEDED {l} ({libs:?}): libibverbs must be loaded at run time \
             (src/verbs/dl.rs), never linked",
            file.display()
        );
    }
}

#[test]
fn the_cli_does_not_link_libibverbs() {
    check(Path::new(env!("CARGO_BIN_EXE_rocev2")));
}

#[test]
fn the_shared_library_does_not_link_libibverbs() {
    // `cargo test` builds the cdylib beside this test binary (deps/); only
    // `cargo build` copies it up a directory, so that copy may be stale.
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir: PathBuf = exe.parent().expect("the test binary's directory").into();
    let lib = dir.join("librocev2.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    check(&lib);
}
