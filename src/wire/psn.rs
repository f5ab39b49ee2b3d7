//! 24-bit packet sequence numbers: the one place that spells their mask and
//! their wrap-around compare (IBA 9.7.1: a PSN is "ahead" when it lies in the
//! half of the 2^24 space after another).

use super::MASK_24;

/// Mask of a PSN.
pub const MASK: u32 = MASK_24;

/// `a - b` as a signed 24-bit distance (positive: `a` is after `b`).
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// `a + n` modulo 2^24.
pub fn add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & MASK
}
