//! The requester and the responder connected through a simulated lossy
//! network (seeded drop, duplicate, reorder in both directions, simulated
//! time, a consumer that holds loans): every message arrives exactly once, in
//! order, byte-exact. A property test over seeds and fault rates, compared
//! against the reference model "delivered == submitted".

use std::collections::VecDeque;

use proptest::prelude::*;

use super::responder::{Responder, ResponderConfig, Verdict};
use crate::emulator::pattern::Rng;
use crate::emulator::requester::{Requester, RequesterConfig};
use crate::wire::{Aeth, Bth};

#[derive(Clone)]
enum Wire {
    Req(Bth, Option<u32>, Vec<u8>),
    Ack(u32, Aeth),
}

struct Net {
    q: VecDeque<(u64, Wire)>,
    rng: Rng,
    drop: f64,
    dup: f64,
    reorder: f64,
}

impl Net {
    fn send(&mut self, now: u64, w: Wire) {
        if self.rng.chance(self.drop) {
            return;
        }
        let latency = 2_000 + self.rng.next_u64() % 3_000;
        let t = if self.rng.chance(self.reorder) {
            now + latency + 20_000
        } else {
            now + latency
        };
        if self.rng.chance(self.dup) {
            self.q.push_back((t + 1_000, w.clone()));
        }
        self.q.push_back((t, w));
    }
    fn due(&mut self, now: u64) -> Vec<Wire> {
        let mut out = Vec::new();
        let mut keep = VecDeque::new();
        while let Some((t, w)) = self.q.pop_front() {
            if t <= now {
                out.push(w)
            } else {
                keep.push_back((t, w))
            }
        }
        self.q = keep;
        out
    }
    fn next_time(&self) -> Option<u64> {
        self.q.iter().map(|(t, _)| *t).min()
    }
}

fn frame(i: u32, pmtu: u32) -> Vec<u8> {
    let len = 1 + (i.wrapping_mul(2654435761) % (3 * pmtu)) as usize;
    (0..len).map(|k| (i as usize * 7 + k) as u8).collect()
}

/// The responder as the soft backend configures it, for frames up to 3 x pmtu.
fn responder(pmtu: u32, first_psn: u32) -> Responder {
    Responder::new(
        ResponderConfig {
            qpn: 7,
            pmtu,
            slot_size: 3 * pmtu,
            min_rnr_timer: 1,
            ack_every: super::ACK_EVERY, // as SoftBackend::connect configures it
        },
        first_psn,
    )
}

/// Runs `n` frames through; returns the delivered imms in order.
fn simulate(
    seed: u64,
    n: u32,
    drop: f64,
    dup: f64,
    reorder: f64,
    slots: u32,
    hold: usize,
) -> Vec<u32> {
    let pmtu = 256;
    let start = 0xff_fff0; // crosses the PSN wrap
    let mut req = Requester::new(RequesterConfig {
        dest_qpn: 7,
        start_psn: start,
        pmtu,
        window: 4, // surf's engine
        timeout_ns: 200_000,
        retry_cnt: 1000,
        rnr_retry: 7,
    });
    let mut resp = responder(pmtu, start);
    let mut slab = vec![vec![0u8; 3 * pmtu as usize]; slots as usize];
    for s in 0..slots {
        resp.post(s);
    }
    let mut to_resp = Net {
        q: VecDeque::new(),
        rng: Rng::new(seed),
        drop,
        dup,
        reorder,
    };
    let mut to_req = Net {
        q: VecDeque::new(),
        rng: Rng::new(seed.rotate_left(17)),
        drop,
        dup,
        reorder,
    };
    for i in 0..n {
        req.submit(frame(i, pmtu), i);
    }
    let mut delivered = Vec::new();
    let mut held: VecDeque<u32> = VecDeque::new();
    let mut now = 0u64;
    let mut steps = 0;
    while !req.is_idle() {
        steps += 1;
        assert!(steps < 2_000_000, "no progress");
        assert!(req.fatal().is_none(), "{:?}", req.fatal());
        while let Some(p) = req.poll_transmit(now) {
            let mut bth = Bth::new(p.opcode, 7, p.psn);
            bth.ack_req = p.ack_req;
            to_resp.send(now, Wire::Req(bth, p.imm, p.payload.to_vec()));
        }
        for w in to_resp.due(now) {
            if let Wire::Req(bth, imm, payload) = w {
                if let Verdict::Place { slot, offset, done } =
                    resp.on_packet(&bth, imm, payload.len())
                {
                    let s = &mut slab[slot as usize];
                    s[offset as usize..offset as usize + payload.len()].copy_from_slice(&payload);
                    if let Some(d) = done {
                        let imm = d.imm.unwrap();
                        assert_eq!(
                            &slab[slot as usize][..d.len as usize],
                            &frame(imm, pmtu)[..]
                        );
                        delivered.push(imm);
                        held.push_back(slot);
                    }
                }
            }
        }
        resp.flush();
        for r in resp.take_replies() {
            to_req.send(
                now,
                Wire::Ack(
                    r.psn,
                    Aeth {
                        syndrome: r.syndrome,
                        msn: r.msn,
                    },
                ),
            );
        }
        // The consumer holds up to `hold` loans, releasing the oldest.
        while held.len() > hold {
            resp.post(held.pop_front().unwrap());
        }
        for w in to_req.due(now) {
            if let Wire::Ack(p, a) = w {
                req.on_ack(p, a, now);
            }
        }
        req.on_timer(now);
        // Advance to the next event.
        let next = [to_resp.next_time(), to_req.next_time(), req.next_deadline()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) if t > now => now = t,
            _ => now += 1_000,
        }
        if held.len() == hold && to_resp.q.is_empty() && to_req.q.is_empty() {
            // Release one loan so a stalled sender can go on.
            if let Some(s) = held.pop_front() {
                resp.post(s);
            }
        }
    }
    assert_eq!(req.stats().acked, n as u64);
    delivered
}

/// surf's engine keeps 4 messages un-ACKed and asks for an ACK only at each
/// message end; the responder counts 8 AckReq packets but ACKs at every
/// receive-batch end, so over an in-order link the engine streams and never
/// waits for its retransmit timeout (a host waiting for the count would stall
/// it: tests/firmware, notes/firmware-sim.md).
#[test]
fn a_four_message_window_streams_without_a_timeout() {
    let pmtu = 256;
    let mut req = Requester::new(RequesterConfig {
        dest_qpn: 7,
        start_psn: 0xff_ff00,
        pmtu,
        window: 4,
        timeout_ns: 100_000,
        retry_cnt: 3,
        rnr_retry: 7,
    });
    let mut resp = responder(pmtu, 0xff_ff00);
    for s in 0..64 {
        resp.post(s);
    }
    let n = 300;
    for i in 0..n {
        req.submit(frame(i, pmtu), i);
    }
    // Each round trip: the requester sends what its window allows, the
    // responder takes it as one receive batch, and its ACKs arrive 10 us later.
    let (mut now, mut delivered) = (0u64, 0u32);
    while !req.is_idle() {
        assert!(now < 1_000_000_000, "no progress: {:?}", req.stats());
        let mut batch = Vec::new();
        while let Some(p) = req.poll_transmit(now) {
            let mut bth = Bth::new(p.opcode, 7, p.psn);
            bth.ack_req = p.ack_req;
            batch.push((bth, p.imm, p.payload.len()));
        }
        assert!(batch.len() <= 4 * 3, "more than 4 messages in flight");
        for (bth, imm, len) in batch {
            if let Verdict::Place {
                slot,
                done: Some(d),
                ..
            } = resp.on_packet(&bth, imm, len)
            {
                assert_eq!(d.imm, Some(delivered));
                delivered += 1;
                resp.post(slot);
            }
        }
        resp.flush();
        now += 10_000;
        for r in resp.take_replies().collect::<Vec<_>>() {
            req.on_ack(
                r.psn,
                Aeth {
                    syndrome: r.syndrome,
                    msn: r.msn,
                },
                now,
            );
        }
        req.on_timer(now);
    }
    assert_eq!(delivered, n);
    let st = req.stats();
    assert_eq!((st.timeouts, st.retransmits), (0, 0), "{st:?}");
    assert!(
        st.acks <= st.submitted / 2,
        "ACKs coalesce per batch: {st:?}"
    );
}

#[test]
fn clean_link_delivers_in_order() {
    let got = simulate(1, 500, 0.0, 0.0, 0.0, 32, 0);
    assert_eq!(got, (0..500).collect::<Vec<_>>());
}

#[test]
fn faults_both_ways_lose_nothing() {
    let got = simulate(42, 3000, 0.02, 0.02, 0.02, 32, 4);
    assert_eq!(got, (0..3000).collect::<Vec<_>>());
}

#[test]
fn few_slots_force_rnr_and_lose_nothing() {
    let got = simulate(7, 500, 0.01, 0.0, 0.0, 2, 1);
    assert_eq!(got, (0..500).collect::<Vec<_>>());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn exactly_once_in_order_under_random_faults(
        seed in any::<u64>(), drop in 0.0f64..0.1, dup in 0.0f64..0.1, reorder in 0.0f64..0.1,
        slots in 1u32..20, hold in 0usize..4,
    ) {
        let got = simulate(seed, 300, drop, dup, reorder, slots, hold.min(slots as usize - 1));
        prop_assert_eq!(got, (0..300).collect::<Vec<_>>());
    }
}
