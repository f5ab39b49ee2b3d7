//! The verifiable frame payload of the FPGA emulator: bytes 0..8 carry the
//! frame's sequence number (little-endian), the rest a xorshift32 stream seeded
//! from it, so a receiver checks every byte of every frame and its order.
//! The same generator is written out in C in tests/c and in Python.
//! Also `Rng`, the crate's one random source for fault draws.

fn seed(seq: u64) -> u32 {
    ((seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32) | 1
}

/// Fills `buf` with the pattern of frame `seq`.
pub fn fill(seq: u64, buf: &mut [u8]) {
    let head = buf.len().min(8);
    buf[..head].copy_from_slice(&seq.to_le_bytes()[..head]);
    let mut s = seed(seq);
    let mut words = buf[head..].chunks_exact_mut(4);
    for w in &mut words {
        s = next(s);
        w.copy_from_slice(&s.to_le_bytes());
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        s = next(s);
        let n = tail.len();
        tail.copy_from_slice(&s.to_le_bytes()[..n]);
    }
}

/// One xorshift32 step.
#[inline(always)]
fn next(mut s: u32) -> u32 {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    s
}

/// xorshift64 (13, 7, 17), the crate's one random source for fault draws
/// (the emulator's faults, the soft tests' lossy network): reproducible
/// from a seed, not the payload pattern above (whose stream is fixed by the
/// C and Python checkers).
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (any value; made odd, so never 0).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// True with probability `p` (never for `p` <= 0).
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// The payload of frame `seq` with `len` bytes.
pub fn make(seq: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(seq, &mut v);
    v
}

/// Checks a payload (at least 8 bytes); returns its sequence number.
pub fn check(data: &[u8]) -> Result<u64, String> {
    if data.len() < 8 {
        return Err(format!(
            "frame of {} bytes is too short for the pattern (>= 8)",
            data.len()
        ));
    }
    let seq = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    let mut s = seed(seq);
    let differs = |i: usize| {
        Err(format!(
            "frame {seq}: payload differs at byte {}",
            8 + 4 * i
        ))
    };
    // Word compares: a slice compare per 4 bytes cost a memcmp call each.
    let mut words = data[8..].chunks_exact(4);
    let mut i = 0;
    for w in &mut words {
        s = next(s);
        if u32::from_le_bytes([w[0], w[1], w[2], w[3]]) != s {
            return differs(i);
        }
        i += 1;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        s = next(s);
        if tail != &s.to_le_bytes()[..tail.len()] {
            return differs(i);
        }
    }
    Ok(seq)
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_corruption() {
        for len in [8, 9, 12, 100, 4096] {
            let f = super::make(77, len);
            assert_eq!(super::check(&f), Ok(77));
            let mut bad = f.clone();
            bad[len - 1] ^= 0x40;
            if len > 8 {
                assert!(super::check(&bad).unwrap_err().contains("differs"));
            }
        }
        assert_ne!(super::make(1, 64), super::make(2, 64));
        assert!(super::check(&[0; 4]).is_err());
    }
}
