//! `./run test` as a new user drives it (issue 38, finding 12): it lists its
//! stages, runs the ones named, goes on past a failed stage and ends with a
//! summary of the failed ones; the firmware stage finds surf in
//! ../shared/firmware without SURF_DIR; the README's CMake build directory
//! is not the one `./run test` uses.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `./run ARGS` with `env`, its output; it must end within a generous bound
/// (these commands fail or list at once; before the fix `./run test ARGS`
/// ignored ARGS and ran the whole suite, 25+ minutes: killed and failed).
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    // Its own process group, so that a run that goes on is ended whole.
    let mut child = Command::new(format!("{ROOT}/run"))
        .process_group(0)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let begun = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if begun.elapsed() > Duration::from_secs(300) {
            // SAFETY: kill(2) on the process group this test started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let o = child.wait_with_output().unwrap();
            panic!(
                "./run {args:?} still running after 300 s (it ran more than asked): {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_test_lists_its_stages_and_refuses_an_unknown_one() {
    let o = run(&["test", "--list"], &[]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out} {}", text(&o.stderr));
    let stages: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with('('))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for want in [
        "lint",
        "rust",
        "python",
        "python-dist",
        "examples",
        "firmware",
        "vm",
    ] {
        assert!(stages.contains(&want), "{want} not in {stages:?}");
    }
    let o = run(&["test", "no-such-stage"], &[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no stage 'no-such-stage'") && err.contains("python-dist"),
        "{err}"
    );
}

/// Two stages that fail at once (their build directory cannot be made): both
/// run, and the summary names both, exit 1.
#[test]
fn run_test_goes_on_past_a_failed_stage_and_names_the_failed_ones() {
    let o = run(
        &["test", "soak", "examples"],
        &[("ROCEV2_BUILD_DIR", "/dev/null/rocev2")],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("stage soak FAILED"), "{err}");
    assert!(err.contains("stage examples FAILED"), "{err}");
    assert!(
        err.contains(
            "./run test: failed stages: soak examples (re-run them: ./run test soak examples)"
        ),
        "{err}"
    );
    assert_eq!(
        err.lines().last(),
        Some("stages: 0 passed, 2 failed"),
        "{err}"
    );
}

/// CI set SURF_DIR; a new user's run skipped the firmware stage although
/// ../shared/firmware/surf-* was there.
#[test]
fn the_firmware_stage_finds_surf_in_shared_without_surf_dir() {
    let shared = std::path::Path::new(ROOT).join("../shared/firmware");
    let surf = std::fs::read_dir(&shared).ok().and_then(|d| {
        d.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("surf-")
                && p.join("ethernet/RoCEv2").is_dir()
        })
    });
    // The test's own environment may carry CI's SURF_DIR: empty is unset.
    let o = run(&["test", "--list"], &[("SURF_DIR", "")]);
    let out = text(&o.stdout);
    match surf {
        Some(p) => {
            let p = p.canonicalize().unwrap();
            assert!(
                out.contains(&format!("(firmware here: {})", p.display())),
                "{out}"
            );
        }
        None => assert!(out.contains("(firmware here: none found"), "{out}"),
    }
}

/// The README's and docs/install.md's `cmake -B DIR` must not be `build/`,
/// which `./run test` fills and clears (build/lib, build/install, build/venv).
#[test]
fn the_documented_cmake_build_directory_is_not_run_tests() {
    for page in ["README.md", "docs/install.md"] {
        let doc = std::fs::read_to_string(format!("{ROOT}/{page}")).unwrap();
        let mut seen = 0;
        for (at, _) in doc.match_indices("cmake -S cmake -B ") {
            let dir = doc[at + "cmake -S cmake -B ".len()..]
                .split_whitespace()
                .next()
                .unwrap();
            assert!(
                dir != "build" && !dir.starts_with("build/"),
                "{page}: `cmake -B {dir}` shares ./run test's build/"
            );
            seen += 1;
        }
        assert!(seen > 0, "{page} has no `cmake -S cmake -B`");
    }
}
