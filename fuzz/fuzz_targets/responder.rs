//! Arbitrary packet sequences (any opcode, PSN near or far from the expected
//! one, any length, foreign QPs), slot posts, consumer releases and flushes
//! into the responder state machine, with the invariants checked after each
//! step: no PSN is placed twice (no delivered duplicate), placement is in
//! order and contiguous within a message, the MSN counts completed messages,
//! a loaned slot is never written, and slot accounting balances.
#![no_main]
use std::collections::{BTreeSet, VecDeque};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rocev2::soft::responder::{Responder, ResponderConfig, Verdict};
use rocev2::wire::{psn, Bth, Opcode};

#[derive(Arbitrary, Debug)]
enum Op {
    Packet {
        opcode: u8,
        psn_delta: i16,
        foreign: bool,
        len: u16,
        ack_req: bool,
    },
    Release {
        which: u8,
    },
    Flush,
}

const SLOTS: u32 = 6;
const PMTU: u32 = 256;

fuzz_target!(|input: (u32, Vec<Op>)| {
    let (start, ops) = input;
    let start = start & psn::MASK;
    let mut r = Responder::new(
        ResponderConfig {
            qpn: 9,
            pmtu: PMTU,
            slot_size: 3 * PMTU,
            min_rnr_timer: 1,
            ack_every: 8,
        },
        start,
    );
    for s in 0..SLOTS {
        r.post(s);
    }
    let mut loaned: VecDeque<u32> = VecDeque::new();
    let mut partial: Option<(u32, u32)> = None; // slot, length so far
    let mut placed_psns = BTreeSet::new();
    let mut messages = 0u32;
    for op in ops {
        match op {
            Op::Packet {
                opcode,
                psn_delta,
                foreign,
                len,
                ack_req,
            } => {
                let before = r.expected_psn();
                let p = psn::add(before, psn_delta as i32 as u32);
                let mut b = Bth::new(Opcode::from_byte(opcode), if foreign { 10 } else { 9 }, p);
                b.ack_req = ack_req;
                let op = b.opcode;
                match r.on_packet(&b, op.has_imm().then_some(7), (len % 1024) as usize) {
                    Verdict::Place { slot, offset, done } => {
                        assert_eq!(p, before, "placed only in sequence");
                        assert!(placed_psns.insert(psn::diff(p, start)), "PSN placed twice");
                        assert_eq!(r.expected_psn(), psn::add(before, 1));
                        assert!(!loaned.contains(&slot), "a loaned slot was written");
                        match partial {
                            Some((s, l)) => assert_eq!((slot, offset), (s, l), "contiguous"),
                            None => assert_eq!(offset, 0, "a message starts at offset 0"),
                        }
                        let total = offset + (len % 1024) as u32;
                        assert!(total <= 3 * PMTU);
                        match done {
                            Some(d) => {
                                assert_eq!((d.slot, d.len), (slot, total));
                                messages += 1;
                                assert_eq!(r.msn(), messages);
                                loaned.push_back(slot);
                                partial = None;
                            }
                            None => partial = Some((slot, total)),
                        }
                    }
                    Verdict::Drop(_) => {
                        assert_eq!(r.expected_psn(), before, "a drop never advances the PSN");
                        if r.next_target().map(|t| t.1) == Some(0) || r.next_target().is_none() {
                            partial = None; // an invalid request discards the partial message
                        }
                    }
                }
            }
            Op::Release { which } => {
                if !loaned.is_empty() {
                    let i = which as usize % loaned.len();
                    let s = loaned.remove(i).unwrap();
                    r.post(s);
                }
            }
            Op::Flush => r.flush(),
        }
        let _ = r.take_replies().count();
        let in_partial = partial.is_some() as usize;
        assert_eq!(
            r.posted() + loaned.len() + in_partial,
            SLOTS as usize,
            "slot accounting"
        );
    }
});
