//! Exhaustive responder tests: every opcode in every state, every PSN case
//! (in sequence, duplicate, ahead, across the 2^24 wrap), RNR, lengths,
//! foreign packets and ACK coalescing.

use super::*;
use crate::wire::{Bth, Opcode, Syndrome};

const QPN: u32 = 0x1234;
const PMTU: u32 = 256;

fn cfg() -> ResponderConfig {
    ResponderConfig {
        qpn: QPN,
        pmtu: PMTU,
        slot_size: 1000,
        min_rnr_timer: 12,
        ack_every: 8,
    }
}

fn resp(first_psn: u32, slots: u32) -> Responder {
    let mut r = Responder::new(cfg(), first_psn);
    for s in 0..slots {
        r.post(s);
    }
    r
}

fn pkt(op: Opcode, psn: u32) -> Bth {
    let mut b = Bth::new(op, QPN, psn);
    b.ack_req = true;
    b
}

fn replies(r: &mut Responder) -> Vec<Reply> {
    r.take_replies().collect()
}

fn ack(psn: u32, msn: u32) -> Reply {
    Reply {
        syndrome: Syndrome::Ack(0x1f),
        psn,
        msn,
    }
}

#[test]
fn send_only_imm_is_placed_and_completed() {
    let mut r = resp(100, 2);
    let v = r.on_packet(&pkt(Opcode::SendOnlyImm, 100), Some(0x305), 200);
    assert_eq!(
        v,
        Verdict::Place {
            slot: 0,
            offset: 0,
            done: Some(Done {
                slot: 0,
                len: 200,
                imm: Some(0x305)
            })
        }
    );
    assert_eq!((r.expected_psn(), r.msn(), r.posted()), (101, 1, 1));
    assert!(replies(&mut r).is_empty(), "coalesced until flush");
    r.flush();
    assert_eq!(replies(&mut r), vec![ack(100, 1)]);
    r.flush();
    assert!(replies(&mut r).is_empty(), "nothing owed");
}

#[test]
fn multi_packet_message_reassembles_in_one_slot() {
    let mut r = resp(0, 1);
    let ops = [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendMiddle,
        Opcode::SendLastImm,
    ];
    let lens = [PMTU, PMTU, PMTU, 10];
    for (i, (op, len)) in ops.iter().zip(lens).enumerate() {
        let v = r.on_packet(
            &pkt(*op, i as u32),
            if op.has_imm() { Some(7) } else { None },
            len as usize,
        );
        let done = (i == 3).then_some(Done {
            slot: 0,
            len: 3 * PMTU + 10,
            imm: Some(7),
        });
        assert_eq!(
            v,
            Verdict::Place {
                slot: 0,
                offset: i as u32 * PMTU,
                done
            },
            "packet {i}"
        );
    }
    assert_eq!(r.msn(), 1);
    assert_eq!(r.stats().messages, 1);
}

#[test]
fn send_last_and_only_without_immediate_complete_without_imm() {
    let mut r = resp(0, 2);
    r.on_packet(&pkt(Opcode::SendFirst, 0), None, PMTU as usize);
    let v = r.on_packet(&pkt(Opcode::SendLast, 1), None, 5);
    assert_eq!(
        v,
        Verdict::Place {
            slot: 0,
            offset: PMTU,
            done: Some(Done {
                slot: 0,
                len: PMTU + 5,
                imm: None
            })
        }
    );
    let v = r.on_packet(&pkt(Opcode::SendOnly, 2), None, 0);
    assert_eq!(
        v,
        Verdict::Place {
            slot: 1,
            offset: 0,
            done: Some(Done {
                slot: 1,
                len: 0,
                imm: None
            })
        }
    );
}

#[test]
fn every_opcode_in_every_state() {
    for byte in 0u8..=0xff {
        let op = Opcode::from_byte(byte);
        for in_message in [false, true] {
            let mut r = resp(0, 2);
            let mut next = 0;
            if in_message {
                r.on_packet(&pkt(Opcode::SendFirst, 0), None, PMTU as usize);
                next = 1;
            }
            let len = if matches!(op, Opcode::SendFirst | Opcode::SendMiddle) {
                PMTU
            } else {
                8
            };
            let v = r.on_packet(&pkt(op, next), op.has_imm().then_some(1), len as usize);
            let valid = match op {
                Opcode::SendFirst | Opcode::SendOnly | Opcode::SendOnlyImm => !in_message,
                Opcode::SendMiddle | Opcode::SendLast | Opcode::SendLastImm => in_message,
                _ => false,
            };
            let rep = replies(&mut r);
            if valid {
                assert!(
                    matches!(v, Verdict::Place { .. }),
                    "{op:?} in_message={in_message}"
                );
                assert!(rep.is_empty());
            } else {
                assert_eq!(
                    v,
                    Verdict::Drop(DropReason::InvalidOpcode),
                    "{op:?} in_message={in_message}"
                );
                assert_eq!(rep.len(), 1);
                assert_eq!(rep[0].syndrome, Syndrome::InvalidRequest);
                assert_eq!(rep[0].psn, next);
                assert_eq!(r.expected_psn(), next, "not advanced");
                assert_eq!(r.posted(), 2, "partial message discarded, slot returned");
            }
        }
    }
}

#[test]
fn duplicates_are_reacked_never_redelivered() {
    let mut r = resp(10, 4);
    for p in 10..13 {
        assert!(matches!(
            r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(p), 4),
            Verdict::Place { .. }
        ));
    }
    r.flush();
    assert_eq!(replies(&mut r), vec![ack(12, 3)]);
    for p in [10, 11, 12, 12] {
        assert_eq!(
            r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(p), 4),
            Verdict::Drop(DropReason::Duplicate)
        );
    }
    r.flush();
    assert_eq!(
        replies(&mut r),
        vec![ack(12, 3)],
        "one re-ACK for the batch"
    );
    assert_eq!(r.stats().duplicates, 4);
    assert_eq!(r.stats().messages, 3);
    assert_eq!(r.posted(), 1);
}

#[test]
fn one_sequence_nak_per_gap() {
    let mut r = resp(0, 8);
    r.on_packet(&pkt(Opcode::SendOnlyImm, 0), Some(0), 4);
    // 1 is lost; 2, 3, 4 arrive.
    for p in 2..5 {
        assert_eq!(
            r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(p), 4),
            Verdict::Drop(DropReason::OutOfSequence)
        );
    }
    let rep = replies(&mut r);
    assert_eq!(
        rep,
        vec![Reply {
            syndrome: Syndrome::PsnSeqErr,
            psn: 1,
            msn: 1
        }]
    );
    r.flush();
    assert!(replies(&mut r).is_empty(), "the NAK acknowledged packet 0");
    // Go-back-N from 1.
    for p in 1..5 {
        assert!(matches!(
            r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(p), 4),
            Verdict::Place { .. }
        ));
    }
    // A new gap gets a new NAK.
    r.on_packet(&pkt(Opcode::SendOnlyImm, 6), Some(6), 4);
    let rep = replies(&mut r);
    assert_eq!(rep.last().unwrap().syndrome, Syndrome::PsnSeqErr);
    assert_eq!(rep.last().unwrap().psn, 5);
    assert_eq!(r.stats().seq_naks, 2);
    assert_eq!(r.stats().out_of_sequence, 4);
}

#[test]
fn no_slot_gives_rnr_nak_and_retry_succeeds() {
    let mut r = resp(0, 1);
    r.on_packet(&pkt(Opcode::SendOnlyImm, 0), Some(0), 4);
    assert_eq!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, 1), Some(1), 4),
        Verdict::Drop(DropReason::NoSlot)
    );
    // The rest of the window is dropped silently.
    assert_eq!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, 2), Some(2), 4),
        Verdict::Drop(DropReason::OutOfSequence)
    );
    let rep = replies(&mut r);
    assert_eq!(
        rep,
        vec![Reply {
            syndrome: Syndrome::RnrNak(12),
            psn: 1,
            msn: 1
        }]
    );
    // Still no slot on the retry: RNR again.
    assert_eq!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, 1), Some(1), 4),
        Verdict::Drop(DropReason::NoSlot)
    );
    r.post(0);
    assert!(matches!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, 1), Some(1), 4),
        Verdict::Place { slot: 0, .. }
    ));
    assert_eq!(r.stats().rnr_naks, 2);
    // A continuing packet never needs a new slot.
    let mut r = resp(0, 1);
    r.on_packet(&pkt(Opcode::SendFirst, 0), None, PMTU as usize);
    assert_eq!(r.posted(), 0);
    assert!(matches!(
        r.on_packet(&pkt(Opcode::SendLastImm, 1), Some(1), 1),
        Verdict::Place { .. }
    ));
}

#[test]
fn length_rules() {
    let cases: [(&[(Opcode, u32)], DropReason); 4] = [
        (&[(Opcode::SendFirst, PMTU - 1)], DropReason::BadLength),
        (&[(Opcode::SendOnlyImm, PMTU + 1)], DropReason::BadLength),
        (
            &[(Opcode::SendFirst, PMTU), (Opcode::SendMiddle, PMTU + 4)],
            DropReason::BadLength,
        ),
        // 4 * 256 = 1024 > slot size 1000
        (
            &[
                (Opcode::SendFirst, PMTU),
                (Opcode::SendMiddle, PMTU),
                (Opcode::SendMiddle, PMTU),
                (Opcode::SendLastImm, PMTU),
            ],
            DropReason::TooLarge { bytes: 4 * PMTU },
        ),
    ];
    for (seq, why) in cases {
        let mut r = resp(0, 2);
        let mut last = None;
        for (i, (op, len)) in seq.iter().enumerate() {
            last = Some(r.on_packet(&pkt(*op, i as u32), None, *len as usize));
        }
        assert_eq!(last, Some(Verdict::Drop(why)), "{seq:?}");
        assert_eq!(
            replies(&mut r).last().unwrap().syndrome,
            Syndrome::InvalidRequest
        );
        assert_eq!(r.posted(), 2, "slot returned");
    }
    // Exactly pmtu and exactly the slot size are fine.
    let mut r = Responder::new(
        ResponderConfig {
            slot_size: 2 * PMTU,
            ..cfg()
        },
        0,
    );
    r.post(0);
    r.on_packet(&pkt(Opcode::SendFirst, 0), None, PMTU as usize);
    let v = r.on_packet(&pkt(Opcode::SendLastImm, 1), Some(0), PMTU as usize);
    assert!(matches!(v, Verdict::Place { done: Some(Done { len, .. }), .. } if len == 2 * PMTU));
}

#[test]
fn psn_wraps_at_2_pow_24() {
    let mut r = resp(0xff_fffe, 8);
    for i in 0..4u32 {
        let p = (0xff_fffe + i) & 0xff_ffff;
        assert!(
            matches!(
                r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(i), 4),
                Verdict::Place { .. }
            ),
            "psn {p:#x}"
        );
    }
    assert_eq!(r.expected_psn(), 2);
    // 0xffffff is now a duplicate, 3 is ahead.
    assert_eq!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, 0xff_ffff), None, 4),
        Verdict::Drop(DropReason::Duplicate)
    );
    assert_eq!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, 3), None, 4),
        Verdict::Drop(DropReason::OutOfSequence)
    );
    r.flush();
    let rep = replies(&mut r);
    assert_eq!(
        rep[0],
        Reply {
            syndrome: Syndrome::PsnSeqErr,
            psn: 2,
            msn: 4
        }
    );
}

#[test]
fn foreign_qp_is_dropped_silently() {
    let mut r = resp(0, 1);
    let mut b = pkt(Opcode::SendOnlyImm, 0);
    b.dest_qp = QPN + 1;
    assert_eq!(
        r.on_packet(&b, Some(0), 4),
        Verdict::Drop(DropReason::WrongQp)
    );
    assert!(replies(&mut r).is_empty());
    assert_eq!(r.expected_psn(), 0);
    assert_eq!(r.stats().wrong_qp, 1);
}

#[test]
fn acks_are_coalesced_every_8_and_on_flush() {
    let mut r = resp(0, 40);
    for p in 0..8 {
        r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(p), 4);
    }
    assert_eq!(replies(&mut r), vec![ack(7, 8)]);
    // ACKs of one batch (replies not yet taken) are cumulative: the later
    // replaces the pending one, and only what is sent is counted.
    for p in 8..24 {
        r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(p), 4);
    }
    assert_eq!(replies(&mut r), vec![ack(23, 24)]);
    assert_eq!(r.stats().acks, 2);
    // A NAK in between is kept, and ACKs on either side of it too.
    r.on_packet(&pkt(Opcode::SendOnlyImm, 24), Some(24), 4);
    r.flush();
    r.on_packet(&pkt(Opcode::SendOnlyImm, 26), Some(26), 4);
    assert_eq!(
        replies(&mut r),
        vec![
            ack(24, 25),
            Reply {
                syndrome: Syndrome::PsnSeqErr,
                psn: 25,
                msn: 25
            }
        ]
    );
    for p in 25..32 {
        r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(p), 4);
    }
    r.flush();
    assert_eq!(replies(&mut r), vec![ack(31, 32)]);
    for p in 32..35 {
        r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(p), 4);
    }
    r.flush();
    assert_eq!(replies(&mut r), vec![ack(34, 35)]);
    // Packets without AckReq are not acknowledged on their own.
    let mut b = pkt(Opcode::SendOnlyImm, 35);
    b.ack_req = false;
    r.on_packet(&b, Some(0), 4);
    r.flush();
    assert!(replies(&mut r).is_empty());
}

#[test]
fn next_target_follows_the_message() {
    let mut r = resp(0, 2);
    assert_eq!(r.next_target(), Some((0, 0)));
    r.on_packet(&pkt(Opcode::SendFirst, 0), None, PMTU as usize);
    assert_eq!(r.next_target(), Some((0, PMTU)));
    r.on_packet(&pkt(Opcode::SendLast, 1), None, 1);
    assert_eq!(r.next_target(), Some((1, 0)));
    r.on_packet(&pkt(Opcode::SendOnly, 2), None, 1);
    assert_eq!(r.next_target(), None);
}

/// surf's engine (fc56630) sets AckReq only on the last packet of a message
/// and stops after 4 un-ACKed messages: 4 AckReq packets, never the 8 that
/// `ack_every` counts. The batch flush must ACK the whole window, at once and
/// at the last message's end (a regression guard for a host that would wait
/// for the count: tests/firmware "stream" shows the engine then times out).
#[test]
fn a_window_of_four_engine_messages_is_acked_at_the_batch_end() {
    let mut r = resp(0xff_fffa, 8); // the 12 PSNs cross the 2^24 wrap
    let mut psn = 0xff_fffa;
    for m in 0..4u32 {
        for (op, ack_req) in [
            (Opcode::SendFirst, false),
            (Opcode::SendMiddle, false),
            (Opcode::SendLastImm, true),
        ] {
            let mut b = pkt(op, psn);
            b.ack_req = ack_req;
            let len = if op == Opcode::SendLastImm { 10 } else { PMTU };
            assert!(matches!(
                r.on_packet(&b, (op == Opcode::SendLastImm).then_some(m), len as usize),
                Verdict::Place { .. }
            ));
            psn = (psn + 1) & 0xff_ffff;
        }
    }
    assert!(
        replies(&mut r).is_empty(),
        "4 AckReq packets: below the count"
    );
    r.flush();
    assert_eq!(
        replies(&mut r),
        vec![ack(5, 4)],
        "one ACK for the 4 messages"
    );
}

#[test]
fn after_an_invalid_request_the_responder_stays_usable() {
    // The chosen policy (docs/concepts.md, "soft"): NAK, drop the partial message, then
    // accept the next in-sequence message, where rxe would enter the error state.
    let mut r = resp(100, 4);
    assert!(matches!(
        r.on_packet(&pkt(Opcode::SendFirst, 100), None, PMTU as usize),
        Verdict::Place { .. }
    ));
    // MIDDLE with a short payload: bad length.
    assert_eq!(
        r.on_packet(&pkt(Opcode::SendMiddle, 101), None, 8),
        Verdict::Drop(DropReason::BadLength)
    );
    let rep = replies(&mut r);
    assert_eq!(rep.len(), 1);
    assert_eq!(
        (rep[0].syndrome, rep[0].psn),
        (Syndrome::InvalidRequest, 101)
    );
    assert_eq!(r.posted(), 4, "the partial message's slot is back");
    // The requester starts over at 101 with a new message: accepted.
    match r.on_packet(&pkt(Opcode::SendOnlyImm, 101), Some(5), 16) {
        Verdict::Place { offset, done, .. } => {
            assert_eq!(offset, 0);
            assert_eq!(done.map(|d| (d.len, d.imm)), Some((16, Some(5))));
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(r.stats().invalid_naks, 1);
}

/// Streams `n` single-packet messages from `psn`, releasing each slot.
fn stream_in(r: &mut Responder, psn: u32, n: u32) {
    for i in 0..n {
        let p = psn::add(psn, i);
        match r.on_packet(&pkt(Opcode::SendOnlyImm, p), Some(i), 4) {
            Verdict::Place { slot, done, .. } => {
                assert!(done.is_some());
                r.post(slot);
            }
            v => panic!("packet {p:#x}: {v:?}"),
        }
    }
}

#[test]
fn a_restarted_peer_at_the_first_psn_is_resynchronised_not_acked_as_old() {
    let first = 0xFF_FF00; // the stream wraps 2^24 on the way
    let mut r = resp(first, 4);
    let far = r.restart_distance() + 1;
    stream_in(&mut r, first, far);
    r.flush();
    let _ = replies(&mut r);
    // The FPGA is re-programmed with the same params: it starts over at the first PSN.
    let v = r.on_packet(&pkt(Opcode::SendOnlyImm, first), Some(0), 4);
    assert!(matches!(v, Verdict::Place { done: Some(_), .. }), "{v:?}");
    assert_eq!(r.stats().peer_restarts, 1);
    let restart = r.take_restart().expect("reported once");
    assert_eq!(
        (restart.expected_psn, restart.psn),
        (psn::add(first, far), first)
    );
    assert_eq!(r.take_restart(), None);
    assert_eq!(
        (r.expected_psn(), r.msn()),
        (psn::add(first, 1), 1),
        "MSN starts over"
    );
    r.flush();
    assert_eq!(replies(&mut r), vec![ack(first, 1)]);
    // Its stream goes on in sequence; a retransmission of it is a duplicate.
    r.post(0);
    stream_in(&mut r, psn::add(first, 1), 10);
    assert_eq!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, first), Some(0), 4),
        Verdict::Drop(DropReason::Duplicate)
    );
    assert_eq!(r.stats().peer_restarts, 1);
}

#[test]
fn retransmissions_within_the_window_stay_duplicates_at_the_first_psn() {
    let mut r = resp(500, 4);
    let d = r.restart_distance();
    stream_in(&mut r, 500, d);
    assert_eq!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, 500), Some(0), 4),
        Verdict::Drop(DropReason::Duplicate),
        "exactly the restart distance behind is still a plausible retransmission"
    );
    assert_eq!((r.stats().peer_restarts, r.stats().stale), (0, 0));
}

#[test]
fn stale_packets_are_not_acked_and_a_run_of_them_counts_a_restart_once() {
    let mut r = resp(0, 4);
    let far = r.restart_distance() + 100;
    stream_in(&mut r, 0, far);
    r.flush();
    let _ = replies(&mut r);
    // The peer restarted elsewhere (or its first packets were lost): a run of
    // message starts and ends away from the first PSN.
    for i in 0..STALE_RUN + 4 {
        let op = if i % 2 == 0 {
            Opcode::SendFirst
        } else {
            Opcode::SendLastImm
        };
        let len = if i % 2 == 0 { PMTU } else { 4 };
        assert_eq!(
            r.on_packet(&pkt(op, 40 + i), Some(i), len as usize),
            Verdict::Drop(DropReason::Stale)
        );
        let want = u64::from(i + 1 >= STALE_RUN);
        assert_eq!(r.stats().peer_restarts, want, "packet {i}");
    }
    r.flush();
    assert!(
        replies(&mut r).is_empty(),
        "stale packets are never ACKed: the sender keeps them"
    );
    assert_eq!(r.stats().stale, STALE_RUN as u64 + 4);
    let suspected = r.take_restart().unwrap();
    assert_eq!(
        (suspected.resynced, suspected.psn, suspected.stale_before),
        (false, 55, 16)
    );
    assert_eq!(
        r.expected_psn(),
        far,
        "no resumption away from the first PSN"
    );
    // Its retransmission from the first PSN: resumed there, not counted again.
    assert!(matches!(
        r.on_packet(&pkt(Opcode::SendOnlyImm, 0), Some(7), 4),
        Verdict::Place { done: Some(_), .. }
    ));
    let resumed = r.take_restart().unwrap();
    assert_eq!((resumed.resynced, resumed.psn), (true, 0));
    assert_eq!((r.expected_psn(), r.stats().peer_restarts), (1, 1));
}

#[test]
fn a_restart_discards_the_open_message_and_returns_its_slot() {
    let mut r = resp(0, 2);
    let far = r.restart_distance() + 1;
    stream_in(&mut r, 0, far);
    let open = r.on_packet(&pkt(Opcode::SendFirst, far), None, PMTU as usize);
    let Verdict::Place { slot, .. } = open else {
        panic!("{open:?}")
    };
    let v = r.on_packet(&pkt(Opcode::SendOnlyImm, 0), Some(0), 4);
    assert_eq!(
        v,
        Verdict::Place {
            slot,
            offset: 0,
            done: Some(Done {
                slot,
                len: 4,
                imm: Some(0)
            })
        },
        "the restarted stream's first message takes the discarded message's slot"
    );
    assert_eq!(r.partial(), None);
}

#[test]
fn a_message_start_takes_the_posted_slot_its_payload_landed_in() {
    let mut r = resp(0, 4);
    let place = |v: Verdict| match v {
        Verdict::Place { slot, offset, .. } => (slot, offset),
        v => panic!("{v:?}"),
    };
    // Landed in posted slot 2: it stays there; the others keep their order.
    assert_eq!(
        place(r.on_packet_in(&pkt(Opcode::SendOnlyImm, 0), Some(1), 10, Some(2))),
        (2, 0)
    );
    assert_eq!(r.free_slots().collect::<Vec<_>>(), [0, 1, 3]);
    // A slot that is not posted (loaned, or never posted) is not taken.
    assert_eq!(
        place(r.on_packet_in(&pkt(Opcode::SendOnlyImm, 1), Some(2), 10, Some(2))),
        (0, 0)
    );
    assert_eq!(
        place(r.on_packet_in(&pkt(Opcode::SendOnlyImm, 2), Some(3), 10, Some(9))),
        (1, 0)
    );
    // A continuation stays in its message's slot, whatever it landed in.
    assert_eq!(
        place(r.on_packet_in(&pkt(Opcode::SendFirst, 3), None, PMTU as usize, Some(3))),
        (3, 0)
    );
    r.post(7);
    assert_eq!(
        place(r.on_packet_in(&pkt(Opcode::SendLastImm, 4), Some(4), 5, Some(7))),
        (3, PMTU)
    );
    // Only an accepted packet moves a slot: a duplicate does not.
    r.post(8);
    r.on_packet_in(&pkt(Opcode::SendOnlyImm, 0), Some(1), 10, Some(8));
    assert_eq!(r.free_slots().collect::<Vec<_>>(), [7, 8]);
}
