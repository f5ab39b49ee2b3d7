//! The landing planner: where the next batch's packets should land so their
//! payloads go from the socket straight into their slab slots (one copy, the
//! kernel's). Pure: it learns the message shape from what the responder
//! placed and plans from the responder's state; no socket, no slab.
//!
//! The guess: packets arrive in sequence and shaped like the last complete
//! message (its packet count and first/last header sizes): first the current
//! partial message's remaining packets, then one message per posted slot. A
//! wrong guess costs a copy, never data: the driver checks each packet's
//! real place (the responder's verdict) against its landing.

use crate::net::Landing;
use crate::wire::BTH_LEN;

/// The shape of the last complete message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Packets per message.
    pub pkts: u32,
    /// Header bytes of its first packet (16: SEND_ONLY_WITH_IMMEDIATE, 12: SEND_FIRST).
    pub first_head: u32,
    /// Header bytes of its last packet.
    pub last_head: u32,
    /// Payload bytes of its last packet (0: not learnt yet).
    pub last_len: u32,
}

impl Default for Shape {
    /// One SEND_ONLY_WITH_IMMEDIATE per frame: what surf's engine sends up to the pmtu.
    fn default() -> Shape {
        Shape {
            pkts: 1,
            first_head: 16,
            last_head: 16,
            last_len: 0,
        }
    }
}

/// What the planner plans from: the responder's view of where in-sequence
/// payloads go next.
pub(crate) struct Targets<I: Iterator<Item = u32>> {
    /// The message being reassembled: its slot and bytes so far.
    pub partial: Option<(u32, u32)>,
    /// Posted slots in the order message starts take them.
    pub free: I,
    /// Path MTU in bytes.
    pub pmtu: u32,
    /// Slot size in bytes.
    pub slot_size: u32,
}

/// Learns message shapes and plans landings.
#[derive(Debug, Default)]
pub(crate) struct Planner {
    shape: Shape,
    /// The current message: packets placed so far and its first header size.
    msg_pkts: u32,
    msg_first_head: u32,
}

impl Planner {
    /// The last complete message's shape.
    #[cfg(test)]
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Fills `plan` with up to `max` landings for the next packets.
    pub fn plan<I: Iterator<Item = u32>>(
        &self,
        plan: &mut Vec<Landing>,
        max: usize,
        mut t: Targets<I>,
    ) {
        plan.clear();
        let shape = self.shape;
        let mut cur = t.partial.map(|(slot, off)| (slot, off, self.msg_pkts));
        while plan.len() < max {
            let Some((slot, offset, idx)) = cur.or_else(|| t.free.next().map(|s| (s, 0, 0))) else {
                break;
            };
            let last = idx + 1 >= shape.pkts;
            let head = if idx == 0 {
                shape.first_head
            } else if last {
                shape.last_head
            } else {
                BTH_LEN as u32
            };
            let len = t.pmtu.min(t.slot_size.saturating_sub(offset));
            if len == 0 {
                break;
            }
            // The payload the packet should carry: the pmtu up to the last
            // packet, which carries what the last message's last one did.
            let expect = match (last, shape.last_len) {
                (true, n) if n > 0 => n.min(len),
                _ => len,
            };
            plan.push(Landing {
                head,
                slot,
                offset,
                len,
                expect,
            });
            cur = (!last).then_some((slot, offset + t.pmtu, idx + 1));
        }
    }

    /// The responder placed a packet with `head` header bytes and `payload`
    /// payload bytes at `offset` of its message; `done` when it ended the
    /// message.
    pub fn learn(&mut self, offset: u32, head: u32, payload: u32, done: bool) {
        if offset == 0 {
            self.msg_pkts = 1;
            self.msg_first_head = head;
        } else {
            self.msg_pkts += 1;
        }
        if done {
            self.shape = Shape {
                pkts: self.msg_pkts,
                first_head: self.msg_first_head,
                last_head: head,
                last_len: payload,
            };
            self.msg_pkts = 0;
        }
    }

    /// The responder discarded the partial message.
    pub fn discard_message(&mut self) {
        self.msg_pkts = 0;
        self.msg_first_head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(
        partial: Option<(u32, u32)>,
        free: &[u32],
        pmtu: u32,
        slot_size: u32,
    ) -> Targets<std::iter::Copied<std::slice::Iter<'_, u32>>> {
        Targets {
            partial,
            free: free.iter().copied(),
            pmtu,
            slot_size,
        }
    }

    fn plan(p: &Planner, t: Targets<impl Iterator<Item = u32>>, max: usize) -> Vec<Landing> {
        let mut v = Vec::new();
        p.plan(&mut v, max, t);
        v
    }

    fn l(head: u32, slot: u32, offset: u32, len: u32) -> Landing {
        Landing {
            head,
            slot,
            offset,
            len,
            expect: len,
        }
    }

    #[test]
    fn single_packet_frames_one_per_posted_slot() {
        let p = Planner::default();
        let v = plan(&p, targets(None, &[7, 3, 9], 4096, 9000), 32);
        assert_eq!(
            v,
            vec![l(16, 7, 0, 4096), l(16, 3, 0, 4096), l(16, 9, 0, 4096)]
        );
    }

    #[test]
    fn stops_at_the_batch_size_and_at_no_slot() {
        let p = Planner::default();
        assert_eq!(plan(&p, targets(None, &[1, 2, 3], 1024, 4096), 2).len(), 2);
        assert!(plan(&p, targets(None, &[], 1024, 4096), 32).is_empty());
    }

    #[test]
    fn learns_a_multi_packet_shape() {
        let mut p = Planner::default();
        // FIRST (12) + MIDDLE (12) + LAST_WITH_IMM (16) into slot 0.
        p.learn(0, 12, 1024, false);
        p.learn(1024, 12, 1024, false);
        p.learn(2048, 16, 952, true);
        assert_eq!(
            p.shape(),
            Shape {
                pkts: 3,
                first_head: 12,
                last_head: 16,
                last_len: 952,
            }
        );
        let v = plan(&p, targets(None, &[5, 6], 1024, 3000), 32);
        assert_eq!(
            v,
            vec![
                l(12, 5, 0, 1024),
                l(12, 5, 1024, 1024),
                l(16, 5, 2048, 952),
                l(12, 6, 0, 1024),
                l(12, 6, 1024, 1024),
                l(16, 6, 2048, 952),
            ]
        );
    }

    #[test]
    fn continues_the_partial_message_first() {
        let mut p = Planner::default();
        for (off, head, done) in [(0, 12, false), (1024, 16, true), (0, 12, false)] {
            p.learn(off, head, 1024, done);
        }
        // Slot 4 holds the first packet of a two-packet message.
        let v = plan(&p, targets(Some((4, 1024)), &[8], 1024, 2048), 32);
        assert_eq!(
            v,
            vec![
                l(16, 4, 1024, 1024),
                l(12, 8, 0, 1024),
                l(16, 8, 1024, 1024)
            ]
        );
    }

    #[test]
    fn a_discarded_message_keeps_the_last_complete_shape() {
        let mut p = Planner::default();
        p.learn(0, 16, 100, true);
        p.learn(0, 12, 1024, false);
        p.discard_message();
        assert_eq!(p.shape().last_len, 100);
        p.learn(0, 12, 1024, false);
        p.learn(1024, 16, 1024, true);
        assert_eq!(p.shape().pkts, 2);
    }

    #[test]
    fn a_full_slot_ends_the_plan_for_that_message() {
        let p = Planner::default();
        // A partial message that already filled its slot: nothing lands there.
        assert!(plan(&p, targets(Some((2, 4096)), &[3], 1024, 4096), 32).is_empty());
    }
}

/// Fuzzing entry (built only by cargo fuzz, which sets `cfg(fuzzing)`):
/// drives a planner with learn / discard / plan steps decoded from `data`
/// (5 bytes each) and checks every plan: at most `max` landings, each inside
/// its slot, in the partial message's slot or a posted one, each slot's
/// landings contiguous from where the message stands.
#[cfg(fuzzing)]
pub fn fuzz(data: &[u8]) {
    let mut p = Planner::default();
    let mut plan = Vec::new();
    for step in data.chunks_exact(5) {
        let (a, b, c) = (
            step[1] as u32,
            step[2] as u32,
            u16::from_le_bytes([step[3], step[4]]) as u32,
        );
        match step[0] % 3 {
            0 => p.learn(c, [12, 16, 24, 28][a as usize % 4], c ^ b, b & 1 == 1),
            1 => p.discard_message(),
            _ => {
                let pmtu = 256 << (a % 5);
                let slot_size = c.max(1);
                let free: Vec<u32> = (0..b % 8).map(|i| 100 + i).collect();
                let partial = (b & 0x80 != 0).then_some((7, (c / 3).min(slot_size)));
                let max = (a as usize >> 3) % 40;
                p.plan(
                    &mut plan,
                    max,
                    Targets {
                        partial,
                        free: free.iter().copied(),
                        pmtu,
                        slot_size,
                    },
                );
                assert!(plan.len() <= max);
                let mut next: Option<(u32, u32)> = partial;
                for l in &plan {
                    assert!(
                        l.offset + l.len <= slot_size && l.len > 0 && l.len <= pmtu,
                        "{l:?}"
                    );
                    assert!(l.expect <= l.len, "{l:?}");
                    assert!(l.slot == 7 || free.contains(&l.slot), "{l:?}");
                    match next {
                        Some((s, off)) if s == l.slot => assert_eq!(l.offset, off, "{l:?}"),
                        _ => assert_eq!(l.offset, 0, "a new message starts at 0: {l:?}"),
                    }
                    next = Some((l.slot, l.offset + pmtu));
                }
            }
        }
    }
}
