//! `recv --out FILE`: frames recorded in rogue's data file format, the one
//! `rogue.utilities.fileio.StreamWriter` writes (default, non-raw mode) and
//! `pyrogue.utilities.fileio.FileReader` / rogue's `StreamReader` read.
//!
//! One record per frame, both header words little-endian:
//!
//! ```text
//! headerA  u32  payload bytes + 4 (the size of headerB plus the payload)
//! headerB  u32  [31:24] channel  [23:16] frame error  [15:0] frame flags
//! payload  N bytes, as received
//! ```
//!
//! A rocev2 frame's channel is bits [7:0] of its immediate data (what
//! rogue's rocev2 Server sets with `setChannel`); error and flags are 0, as
//! that server leaves them. Frames with an empty payload are not recorded
//! (StreamWriter skips them too).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes frames to a file in rogue's StreamWriter format.
pub struct RogueWriter {
    out: BufWriter<File>,
    path: PathBuf,
    /// Frames written.
    pub records: u64,
    /// Empty frames skipped (as StreamWriter does).
    pub skipped_empty: u64,
}

/// The two header words of a record for a payload of `len` bytes.
pub fn header(len: u32, channel: u8, error: u8, flags: u16) -> [u8; 8] {
    let a = len + 4;
    let b = (channel as u32) << 24 | (error as u32) << 16 | flags as u32;
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&a.to_le_bytes());
    h[4..].copy_from_slice(&b.to_le_bytes());
    h
}

impl RogueWriter {
    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> std::io::Result<RogueWriter> {
        Ok(RogueWriter {
            out: BufWriter::with_capacity(1 << 20, File::create(path)?),
            path: path.to_path_buf(),
            records: 0,
            skipped_empty: 0,
        })
    }

    /// True when the file is a regular file (not a pipe, FIFO, socket or
    /// device).
    pub fn is_regular_file(&self) -> bool {
        self.out
            .get_ref()
            .metadata()
            .is_ok_and(|m| m.file_type().is_file())
    }

    /// Appends one frame (a no-op for an empty payload).
    pub fn write(&mut self, channel: u8, data: &[u8]) -> Result<(), String> {
        if data.is_empty() {
            self.skipped_empty += 1;
            return Ok(());
        }
        // Slots are at most 1 GiB (--max-payload), so len + 4 fits 32 bits.
        let len = u32::try_from(data.len()).expect("a receive slot is < 4 GiB");
        self.out
            .write_all(&header(len, channel, 0, 0))
            .and_then(|_| self.out.write_all(data))
            .map_err(|e| self.err(e))?;
        self.records += 1;
        Ok(())
    }

    /// Flushes the file to the kernel.
    pub fn finish(mut self) -> Result<(), String> {
        self.out.flush().map_err(|e| self.err(e))
    }

    fn err(&self, e: std::io::Error) -> String {
        let why = match e.kind() {
            std::io::ErrorKind::BrokenPipe => {
                " (the pipe's or FIFO's reader exited; what it had not read is lost)"
            }
            _ => "",
        };
        format!(
            "--out {}: writing the recording failed at record {}: {e}{why}",
            self.path.display(),
            self.records + 1
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of rogue's format documentation
    /// (docs/src/built_in_modules/utilities/fileio/format.rst).
    #[test]
    fn header_matches_rogues_documented_example() {
        assert_eq!(
            header(0x20, 0x03, 0x00, 0x00A5),
            [0x24, 0, 0, 0, 0xA5, 0x00, 0x00, 0x03]
        );
        assert_eq!(header(1, 0xff, 0x12, 0xbeef)[4..], [0xef, 0xbe, 0x12, 0xff]);
    }
}
