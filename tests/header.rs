//! include/rocev2.h must be exactly what cbindgen generates from src/ffi.
//! Regenerate with: ROCEV2_BLESS=1 cargo test --test header

use std::path::PathBuf;

#[test]
fn header_is_up_to_date() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let path = root.join("include/rocev2.h");
    if std::env::var_os("ROCEV2_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/rocev2.h is stale: run `ROCEV2_BLESS=1 cargo test --test header` and commit it"
    );
}

#[test]
fn header_declares_every_exported_function() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(root.join("include/rocev2.h")).unwrap();
    let mut src = String::new();
    for f in std::fs::read_dir(root.join("src/ffi")).unwrap() {
        src += &std::fs::read_to_string(f.unwrap().path()).unwrap();
    }
    let mut n = 0;
    // The exported functions (`pub`); a private `extern "C" fn` is a
    // callback the library hands to C (pthread_atfork's), not the API.
    for line in src.lines().filter(|l| l.trim_start().starts_with("pub ")) {
        if let Some(rest) = line.split("extern \"C\" fn ").nth(1) {
            let name = rest.split('(').next().unwrap();
            assert!(
                header.contains(&format!("{name}(")),
                "{name} missing from the header"
            );
            n += 1;
        }
    }
    assert!(n >= 20, "found only {n} exported functions");
}

#[test]
fn header_exports_only_the_c_api_namespace() {
    // cbindgen exports every public constant of the crate; only the C API's
    // own (ROCEV2_*) may reach the header (add others to cbindgen.toml's exclude).
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(root.join("include/rocev2.h")).unwrap();
    for line in header.lines().filter(|l| l.starts_with("#define ")) {
        let name = line.split_whitespace().nth(1).unwrap();
        assert!(
            name.starts_with("ROCEV2_"),
            "non-API constant in the header: {line}"
        );
    }
    for line in header
        .lines()
        .filter(|l| l.starts_with("typedef struct ") && l.ends_with(';'))
    {
        assert!(
            line.contains(" rocev2_"),
            "non-API type in the header: {line}"
        );
    }
}
