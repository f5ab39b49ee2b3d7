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
    let mut words = Words::new(seed(seq));
    let mut round = [0u32; ROUND];
    for part in buf[head..].chunks_mut(4 * ROUND) {
        words.next_round(&mut round);
        let whole = part.len() / 4;
        let mut quads = part.chunks_exact_mut(4);
        for (d, w) in (&mut quads).zip(round) {
            d.copy_from_slice(&w.to_le_bytes());
        }
        // A last partial word takes its word's first bytes.
        let tail = quads.into_remainder();
        let n = tail.len();
        tail.copy_from_slice(&round[whole.min(ROUND - 1)].to_le_bytes()[..n]);
    }
}

/// One xorshift32 step.
#[inline(always)]
const fn next(mut s: u32) -> u32 {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    s
}

/// Independent runs the stream is cut into, and the words of each.
const LANES: usize = 8;
const RUN: usize = 64;
/// Words made per round: the stream's next ROUND words.
const ROUND: usize = LANES * RUN;

/// [`RUN`] steps at once: column i is `next` applied RUN times to bit i
/// alone (xorshift is linear over GF(2), so any state's jump is the XOR of
/// the columns of its set bits).
const JUMP: [u32; 32] = {
    let mut cols = [0u32; 32];
    let mut i = 0;
    while i < 32 {
        let mut x = 1u32 << i;
        let mut k = 0;
        while k < RUN {
            x = next(x);
            k += 1;
        }
        cols[i] = x;
        i += 1;
    }
    cols
};

/// The state RUN steps after `x`.
fn jump(x: u32) -> u32 {
    let mut acc = 0;
    for (i, c) in JUMP.iter().enumerate() {
        acc ^= c & 0u32.wrapping_sub((x >> i) & 1);
    }
    acc
}

/// The pattern's xorshift32 stream, [`ROUND`] words per round. One step
/// after another, each word waits for the last (about 6 cycles a word, the
/// whole cost of `fpga-sim`'s fill and `recv --verify`'s check); here each
/// round is cut into [`LANES`] runs of [`RUN`] words whose starts are
/// reached by [`jump`], and the runs are stepped side by side (independent:
/// the compiler keeps them in vector registers). The same words, several
/// times faster.
struct Words(u32);

impl Words {
    /// The stream after `seed` (its first word is `next(seed)`).
    fn new(seed: u32) -> Words {
        Words(seed)
    }

    /// The next ROUND words, in order.
    fn next_round(&mut self, out: &mut [u32; ROUND]) {
        let mut lanes = [0u32; LANES];
        for l in &mut lanes {
            *l = self.0;
            self.0 = jump(self.0);
        }
        for k in 0..RUN {
            for (j, l) in lanes.iter_mut().enumerate() {
                *l = next(*l);
                out[j * RUN + k] = *l;
            }
        }
    }
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
    let differs = |i: usize| {
        Err(format!(
            "frame {seq}: payload differs at byte {}",
            8 + 4 * i
        ))
    };
    let mut words = Words::new(seed(seq));
    let mut round = [0u32; ROUND];
    for (r, part) in data[8..].chunks(4 * ROUND).enumerate() {
        words.next_round(&mut round);
        // Word compares: a slice compare per 4 bytes cost a memcmp call each.
        let mut quads = part.chunks_exact(4);
        for (k, (d, w)) in (&mut quads).zip(round).enumerate() {
            if u32::from_le_bytes([d[0], d[1], d[2], d[3]]) != w {
                return differs(r * ROUND + k);
            }
        }
        let tail = quads.remainder();
        let whole = part.len() / 4;
        if tail != &round[whole.min(ROUND - 1)].to_le_bytes()[..tail.len()] {
            return differs(r * ROUND + whole);
        }
    }
    Ok(seq)
}

#[cfg(test)]
mod tests {
    /// The pattern as specified (and as the C and Python checkers make it):
    /// one xorshift32 step per 4 bytes.
    fn one_word_at_a_time(seq: u64, len: usize) -> Vec<u8> {
        let mut v = seq.to_le_bytes()[..len.min(8)].to_vec();
        let mut s = super::seed(seq);
        while v.len() < len {
            s = super::next(s);
            let n = (len - v.len()).min(4);
            v.extend_from_slice(&s.to_le_bytes()[..n]);
        }
        v
    }

    #[test]
    fn the_runs_make_the_specified_stream() {
        for seq in [0, 1, 77, u64::MAX] {
            let lens = (0..=300).chain([2055, 2056, 2057, 4095, 4096, 4097, 9000, 65536]);
            for len in lens {
                let f = super::make(seq, len);
                assert_eq!(f, one_word_at_a_time(seq, len), "seq {seq} len {len}");
                if len >= 8 {
                    assert_eq!(super::check(&f), Ok(seq), "seq {seq} len {len}");
                }
            }
        }
    }

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
        // The error names the first differing byte's word, in any round.
        for at in [8 + 4 * 37 + 2, 8 + 4 * (super::ROUND + 3)] {
            let mut f = super::make(5, 9000);
            f[at] ^= 1;
            let word_start = at - (at - 8) % 4;
            assert_eq!(
                super::check(&f).unwrap_err(),
                format!("frame 5: payload differs at byte {word_start}")
            );
        }
        assert!(super::check(&[0; 4]).is_err());
    }
}
