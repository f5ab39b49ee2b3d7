use super::*;

fn cfg() -> RequesterConfig {
    RequesterConfig {
        dest_qpn: 0x11,
        start_psn: 0xff_fffe,
        pmtu: 256,
        window: 4,
        timeout_ns: 1_000_000,
        retry_cnt: 2,
        rnr_retry: 7,
    }
}

fn ack(psn: u32) -> (u32, Aeth) {
    (
        psn,
        Aeth {
            syndrome: Syndrome::Ack(0x1f),
            msn: 0,
        },
    )
}

fn drain(r: &mut Requester, now: u64) -> Vec<(u32, Opcode, usize, bool)> {
    let mut out = Vec::new();
    while let Some(p) = r.poll_transmit(now) {
        out.push((p.psn, p.opcode, p.payload.len(), p.retransmit));
    }
    out
}

#[test]
fn packetizes_frames_like_surf() {
    let mut r = Requester::new(cfg());
    r.submit(vec![1; 100], 0x105);
    r.submit(vec![2; 600], 0x206);
    let sent = drain(&mut r, 0);
    assert_eq!(
        sent,
        vec![
            (0xff_fffe, Opcode::SendOnlyImm, 100, false),
            (0xff_ffff, Opcode::SendFirst, 256, false),
            (0, Opcode::SendMiddle, 256, false),
            (1, Opcode::SendLastImm, 88, false),
        ]
    );
    assert!(
        r.poll_transmit(0).is_none(),
        "window of 4 full / queue empty"
    );
    r.on_ack(1, ack(1).1, 10);
    assert!(r.is_idle());
    assert_eq!(r.stats().acked, 2);
    assert_eq!(r.stats().bytes_acked, 700);
}

#[test]
fn window_limits_inflight_and_acks_open_it() {
    let mut r = Requester::new(cfg());
    for i in 0..10 {
        r.submit(vec![i; 8], i as u32);
    }
    assert_eq!(drain(&mut r, 0).len(), 4);
    let (p, a) = ack(0xff_ffff);
    r.on_ack(p, a, 1);
    assert_eq!(drain(&mut r, 1).len(), 2);
    assert_eq!(r.outstanding(), 8);
}

#[test]
fn seq_nak_goes_back_n() {
    let mut r = Requester::new(cfg());
    for i in 0..4 {
        r.submit(vec![i; 8], i as u32);
    }
    drain(&mut r, 0);
    r.on_ack(
        0xff_ffff,
        Aeth {
            syndrome: Syndrome::PsnSeqErr,
            msn: 1,
        },
        5,
    );
    let again = drain(&mut r, 5);
    assert_eq!(
        again.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![0xff_ffff, 0, 1]
    );
    assert!(again.iter().all(|p| p.3), "all retransmissions");
    assert_eq!(
        r.stats().acked,
        1,
        "the NAK acknowledged the packet before it"
    );
    assert_eq!(r.stats().retransmits, 3);
}

#[test]
fn rnr_nak_waits_the_timer_then_retries() {
    let mut r = Requester::new(cfg());
    r.submit(vec![0; 8], 0);
    r.submit(vec![1; 8], 1);
    drain(&mut r, 0);
    r.on_ack(
        0xff_fffe,
        Aeth {
            syndrome: Syndrome::RnrNak(12),
            msn: 0,
        },
        1000,
    );
    assert!(r.poll_transmit(1000).is_none());
    assert!(
        r.poll_transmit(1000 + 639_999).is_none(),
        "0.64 ms not over"
    );
    assert_eq!(r.next_deadline(), Some(1000 + 640_000));
    let again = drain(&mut r, 1000 + 640_000);
    assert_eq!(again.len(), 2);
    assert_eq!(r.stats().rnr_naks, 1);
}

#[test]
fn timeout_retransmits_then_gives_up_and_counts_the_loss() {
    let mut r = Requester::new(cfg());
    r.submit(vec![0; 8], 0);
    drain(&mut r, 0);
    assert_eq!(r.next_deadline(), Some(1_000_000));
    r.on_timer(999_999);
    assert_eq!(r.stats().timeouts, 0);
    let mut now = 1_000_000;
    for attempt in 1..=2 {
        r.on_timer(now);
        assert_eq!(r.stats().timeouts, attempt);
        assert_eq!(drain(&mut r, now).len(), 1);
        now += 1_000_000;
    }
    r.on_timer(now);
    let f = r.fatal().unwrap();
    assert!(f.reason.contains("retries exhausted"), "{}", f.reason);
    assert!(f.gave_up, "retries that ran out are a give-up (a timeout)");
    assert_eq!(f.lost_messages, 1);
    assert!(r.poll_transmit(now).is_none());
}

#[test]
fn fatal_nak_fails_and_counts_lost_messages() {
    let mut r = Requester::new(cfg());
    r.submit(vec![0; 8], 0);
    r.submit(vec![0; 8], 0);
    drain(&mut r, 0);
    r.on_ack(
        0xff_fffe,
        Aeth {
            syndrome: Syndrome::InvalidRequest,
            msn: 0,
        },
        1,
    );
    let f = r.fatal().unwrap();
    assert_eq!(f.lost_messages, 2);
    assert!(!f.gave_up, "a fatal NAK is a refusal, not a timeout");
}

#[test]
fn stale_and_future_acks_are_harmless() {
    let mut r = Requester::new(cfg());
    r.submit(vec![0; 8], 0);
    drain(&mut r, 0);
    let (_, a) = ack(0);
    r.on_ack(0xff_fff0, a, 1); // before the window
    assert_eq!(r.stats().stale_acks, 1);
    assert_eq!(r.outstanding(), 1);
    r.on_ack(0x10, a, 1); // beyond anything sent: acknowledges only what was sent
    assert!(r.is_idle());
    assert_eq!(r.next_deadline(), None);
}

#[test]
fn timeout_codes() {
    assert_eq!(RequesterConfig::timeout_from_code(14), 4096 << 14);
    assert_eq!(RequesterConfig::timeout_from_code(0), u64::MAX);
}

/// Like surf's engine: the window counts messages, not packets, and only the
/// last packet of a message asks for an ACK.
#[test]
fn window_counts_messages_and_ack_req_marks_message_ends() {
    let mut r = Requester::new(cfg()); // window 4, pmtu 256
    for i in 0..6 {
        r.submit(vec![i; 600], i as u32); // 3 packets each
    }
    let mut sent = Vec::new();
    while let Some(p) = r.poll_transmit(0) {
        sent.push((p.psn, p.opcode, p.ack_req));
    }
    assert_eq!(sent.len(), 12, "4 messages of 3 packets");
    for (i, (_, op, ack_req)) in sent.iter().enumerate() {
        assert_eq!(*ack_req, i % 3 == 2, "packet {i} ({op:?})");
        assert_eq!(*ack_req, op.ends_message());
    }
    // Acknowledging the first message lets exactly one more message start.
    let (p, a) = ack(sent[2].0);
    r.on_ack(p, a, 1);
    assert_eq!(drain(&mut r, 1).len(), 3);
    assert!(r.poll_transmit(1).is_none());
}

/// The engine counts RNR retries anew after progress: an RNR NAK that
/// acknowledges earlier messages does not use up rnr_retry.
#[test]
fn rnr_retries_count_anew_after_progress() {
    let mut r = Requester::new(RequesterConfig {
        rnr_retry: 1,
        ..cfg()
    });
    for i in 0..3 {
        r.submit(vec![i; 8], i as u32);
    }
    drain(&mut r, 0);
    let rnr = Aeth {
        syndrome: Syndrome::RnrNak(1),
        msn: 0,
    };
    let mut now = 0;
    // One RNR NAK at each message in turn: progress every time, no failure.
    for psn in [0xff_fffe, 0xff_ffff, 0] {
        r.on_ack(psn, rnr, now);
        assert!(r.fatal().is_none(), "RNR at {psn:#x}");
        now += 10_000;
        drain(&mut r, now);
    }
    // Two in a row at one PSN exceed rnr_retry 1: the frame fails.
    r.on_ack(0, rnr, now);
    assert!(r.fatal().unwrap().reason.contains("RNR retries exhausted"));
    assert!(r.fatal().unwrap().gave_up);
}

#[test]
fn acked_buffers_come_back_as_many_as_were_in_flight() {
    let mut r = Requester::new(RequesterConfig {
        window: 200,
        ..cfg()
    });
    for i in 0..100u8 {
        r.submit(vec![i; 10], 0);
    }
    let sent = drain(&mut r, 0);
    assert_eq!(sent.len(), 100);
    // One ACK for all 100: every buffer is kept for the next 100 frames.
    r.on_ack(sent[99].0, ack(sent[99].0).1, 1);
    assert!(r.is_idle());
    let mut back = 0;
    while let Some(b) = r.take_spent() {
        assert_eq!(b.len(), 10);
        back += 1;
    }
    assert_eq!(back, 100);
    // A caller that never takes them: kept at most as many as its peak.
    for _ in 0..3 {
        for i in 0..100u8 {
            r.submit(vec![i; 10], 0);
        }
        let sent = drain(&mut r, 2);
        r.on_ack(sent[99].0, ack(sent[99].0).1, 3);
    }
    let mut kept = 0;
    while r.take_spent().is_some() {
        kept += 1;
    }
    assert_eq!(kept, 100);
}
