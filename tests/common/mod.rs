//! Helpers shared by the integration tests that drive the `rocev2` CLI.

/// The value of `key` in one line of the CLI's JSON output, as text: a
/// number, or a string without its quotes (GIDs keep their colons).
pub fn field(json: &str, key: &str) -> String {
    let at = json
        .find(&format!("\"{key}\": "))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    let rest = &json[at + key.len() + 4..];
    let rest = rest.trim_start_matches('"');
    rest.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == ':')
        .collect()
}

/// [`field`] of a number.
#[allow(dead_code)] // not every test crate reads numbers
pub fn number(json: &str, key: &str) -> u64 {
    let v = field(json, key);
    v.parse()
        .unwrap_or_else(|_| panic!("{key} = {v:?} is not a number in {json}"))
}
