//! A received frame on loan.

use std::sync::Arc;

use super::ServerCore;

/// A C release token, `serial << 16 | slot`: the loan's serial (48 bits,
/// never 0, so a token is never 0) and the slot (16 bits: at most 65536
/// slots). Serials are unique in the process (`slab::SERIAL_LIMIT`): a
/// token of another server, or of an earlier loan of the same slot, names
/// a serial no live loan of this server carries, and is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    pub serial: u64,
    pub slot: u32,
}

impl Token {
    /// The 64-bit value C sees.
    pub fn encode(self) -> u64 {
        (self.serial << 16) | self.slot as u64
    }

    /// The token `v` names, if it is not 0 (a value C made up may still
    /// name no loan: the loan table decides).
    pub fn decode(v: u64) -> Option<Token> {
        let t = Token {
            serial: v >> 16,
            slot: (v & 0xffff) as u32,
        };
        (t.serial != 0).then_some(t)
    }
}

/// Where a frame's receive time ([`Frame::rx_time_ns`]) comes from. Either
/// way it is the host's CLOCK_REALTIME, in nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxTimeSource {
    /// The kernel's receive stamp of the frame's last packet (soft backend:
    /// `SO_TIMESTAMPNS`, taken in the kernel's receive path).
    Kernel,
    /// The host clock when the receive thread polled the completion (verbs:
    /// the NIC delivers without the kernel; later than the packet by the
    /// completion's wait in the CQ).
    Poll,
    /// The NIC's completion timestamp of the frame, on the host clock
    /// (verbs on a device that stamps completions, mlx5: the extended CQ's
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, converted from the NIC's
    /// clock through an anchor taken every second).
    Nic,
}

/// A received frame on loan: `data()` points into the slab (zero copy). The
/// slot is re-posted when the frame is dropped (or its token released).
pub struct Frame {
    /// The frame's reference to its core: `Some` for as long as the frame
    /// lives; taken by `drop` (handed to the release path, which keeps it
    /// for the receive thread's next frame when the frame is released on
    /// that thread) or by `into_token` (kept by the core for the token).
    pub(super) core: Option<Arc<ServerCore>>,
    pub(super) slot: u32,
    pub(super) serial: u64,
    pub(super) len: u32,
    pub(super) imm: Option<u32>,
    /// When its last packet was received (CLOCK_REALTIME ns) and how that
    /// is known.
    pub(super) rx_ns: u64,
    pub(super) rx_src: RxTimeSource,
}

impl Frame {
    /// The payload, in place in the receive slab.
    pub fn data(&self) -> &[u8] {
        self.core
            .as_ref()
            .and_then(|c| c.slab.loaned(self.slot, self.serial, self.len))
            .unwrap_or(&[])
    }
    /// Payload length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }
    /// True for an empty payload (never delivered: such frames are dropped).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The channel: immediate bits \[7:0\] (0 for a message without one).
    pub fn channel(&self) -> u8 {
        (self.imm.unwrap_or(0) & 0xff) as u8
    }
    /// The immediate (host order), if the message carried one (surf's engine
    /// always sends one; a generic RC sender may not).
    pub fn immediate(&self) -> Option<u32> {
        self.imm
    }
    /// True when the message carried an immediate.
    pub fn has_immediate(&self) -> bool {
        self.imm.is_some()
    }
    /// The FPGA's ring position: immediate bits \[31:8\] (0 without one).
    pub fn ring_position(&self) -> u32 {
        self.imm.unwrap_or(0) >> 8
    }
    /// When the frame's last packet was received: host CLOCK_REALTIME,
    /// nanoseconds since the Unix epoch ([`Frame::rx_time_source`] says
    /// whose stamp it is).
    pub fn rx_time_ns(&self) -> u64 {
        self.rx_ns
    }
    /// Where [`Frame::rx_time_ns`] comes from: the kernel's receive stamp
    /// (soft) or the host clock at poll (verbs).
    pub fn rx_time_source(&self) -> RxTimeSource {
        self.rx_src
    }
    /// The receive slot index (its address is `mr_addr + slot * max_payload`).
    pub fn slot(&self) -> u32 {
        self.slot
    }
    /// Releases the loan now (the same as dropping the frame).
    pub fn release(self) {}

    /// Turns the loan into a release token for [`ServerCore::release_token`]
    /// (the loan table marks it a token's loan, which only a token release
    /// ends). The frame's reference to the core goes to the core's
    /// `token_refs` (the core outlives its handle while tokens are
    /// outstanding); `release_token` takes one back. Tokens are never 0.
    pub(crate) fn into_token(mut self) -> u64 {
        let core = self.core.take().expect("a live frame holds its core");
        // A frame's loan cannot be ended by anyone but the frame (a token
        // release needs the token state set here), so this always succeeds.
        let handed = core.slab.to_token(self.slot, self.serial);
        debug_assert!(handed, "a live frame's loan is a frame's loan");
        let token = Token {
            serial: self.serial,
            slot: self.slot,
        };
        ServerCore::keep_for_token(core);
        token.encode()
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        if let Some(core) = self.core.take() {
            ServerCore::release_frame(core, self.slot, self.serial);
        }
    }
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .field("channel", &self.channel())
            .field("imm", &self.imm.map(|i| format!("{i:#010x}")))
            .field("rx_time_ns", &self.rx_ns)
            .field("rx_time_source", &self.rx_src)
            .finish()
    }
}
