//! The emulator's streams: a plan (how many frames, on which channels, how
//! many queued, in what time), its pacing at the configured rate, and the
//! `stream*` entry points of [`FpgaEmulator`] that submit frames as the
//! requester's window and the pace allow, restart where configured, and
//! wait until every frame is acknowledged.

use std::time::{Duration, Instant};

use super::pattern;
use super::tx::Template;
use super::FpgaEmulator;
use crate::error::{Error, ErrorKind, Result};

/// The pacing granularity: a NIC's receive interrupt coalescing (typically
/// 8-50 us) hands the host a link's packets in bursts of about this long.
const PACE_TICK: Duration = Duration::from_micros(20);

/// The pacing of a stream: how many frames are due.
struct Pace {
    start: Instant,
    rate: Option<f64>,
}

impl Pace {
    fn new(rate: Option<f64>) -> Pace {
        Pace {
            start: Instant::now(),
            rate: rate.filter(|r| *r > 0.0),
        }
    }
    /// Frames due by now (all, unpaced). Paced frames are released in
    /// bursts of what the rate sends in [`PACE_TICK`], as a NIC's interrupt
    /// coalescing hands a host the packets of a link at that rate.
    fn due(&self) -> u64 {
        match self.rate {
            Some(r) => {
                let tick = PACE_TICK.as_secs_f64();
                let ticks = (self.start.elapsed().as_secs_f64() / tick) as u64 + 1;
                (ticks as f64 * tick * r) as u64
            }
            None => u64::MAX,
        }
    }
}

/// What [`FpgaEmulator::stream_into`] streams.
#[derive(Debug, Clone, Copy)]
pub struct StreamPlan<'a> {
    /// Frames to send.
    pub frames: u64,
    /// Frame i goes on channel `channels[i % len]` (empty: channel 0).
    pub channels: &'a [u8],
    /// At most this many frames queued (un-ACKed) at once.
    pub queue: usize,
    /// The whole stream's time limit: a timeout error after it.
    pub timeout: Duration,
}

impl<'a> StreamPlan<'a> {
    /// `frames` frames on `channels`, at most `queue` queued, in `timeout`.
    pub fn new(frames: u64, channels: &'a [u8], queue: usize, timeout: Duration) -> Self {
        StreamPlan {
            frames,
            channels,
            queue,
            timeout,
        }
    }
}

/// A fill for [`FpgaEmulator::stream_into`] that makes every frame a copy
/// of `template`: a new buffer is filled, a recycled one of its length is
/// taken to hold it already (no copy per frame: the caller's stream must
/// not recycle buffers of other contents).
pub fn copies_of(template: &[u8]) -> impl FnMut(u64, &mut Vec<u8>) + '_ {
    move |_, buf: &mut Vec<u8>| {
        if buf.len() != template.len() {
            buf.clear();
            buf.extend_from_slice(template);
        }
    }
}

/// A fill for [`FpgaEmulator::stream_into`] that makes frame `seq` the
/// pattern frame of `size` bytes (what [`FpgaEmulator::stream`] sends).
fn patterns(size: usize) -> impl FnMut(u64, &mut Vec<u8>) {
    move |seq: u64, buf: &mut Vec<u8>| {
        buf.resize(size, 0);
        pattern::fill(seq, buf);
    }
}

impl FpgaEmulator {
    /// Streams `frames` pattern frames of `size` bytes (frame i on channel
    /// `channels[i % len]`), keeping at most `queue` frames queued, and waits
    /// until all are acknowledged. `progress(acked)` is called now and then.
    pub fn stream(
        &mut self,
        frames: u64,
        size: usize,
        channels: &[u8],
        queue: usize,
        timeout: Duration,
        progress: impl FnMut(u64),
    ) -> Result<()> {
        self.stream_into(
            &StreamPlan::new(frames, channels, queue, timeout),
            patterns(size),
            progress,
        )
    }

    /// Like [`FpgaEmulator::stream`] with frame payloads from `payload(seq)`.
    pub fn stream_with(
        &mut self,
        frames: u64,
        mut payload: impl FnMut(u64) -> Vec<u8>,
        channels: &[u8],
        queue: usize,
        timeout: Duration,
        progress: impl FnMut(u64),
    ) -> Result<()> {
        self.stream_into(
            &StreamPlan::new(frames, channels, queue, timeout),
            |seq, buf: &mut Vec<u8>| *buf = payload(seq),
            progress,
        )
    }

    /// Streams as `plan` says (see [`FpgaEmulator::stream`]) with `template`
    /// as every frame's payload: the bench's sender at surf's window. A packet of it is
    /// sealed from the template's ICRC share, worked out once per span
    /// ([`KnownPayload`](crate::wire::icrc::KnownPayload)), so the sender
    /// costs about what an FPGA's does (its ICRC is free, in hardware) and
    /// the rows measure the host. The ICRCs are the real ones.
    pub fn stream_template(
        &mut self,
        plan: &StreamPlan<'_>,
        template: &[u8],
        progress: impl FnMut(u64),
    ) -> Result<()> {
        if !self.req.is_idle() {
            return Err(Error::invalid(format!(
                "stream_template: {} messages of an earlier stream are still unacknowledged; \
                 wait for them first (run_until_idle)",
                self.req.outstanding()
            )));
        }
        // Every buffer from here on is filled below: a recycled one holds
        // the template already (no copy, no compare per frame).
        while self.req.take_spent().is_some() {}
        self.template = Some(Template::new(template, self.req.next_msg()));
        let streamed = self.stream_into(plan, copies_of(template), progress);
        self.template = None;
        streamed
    }

    /// Streams as `plan` says (see [`FpgaEmulator::stream`]), filling
    /// `fill(seq, buf)` into the buffer of an acknowledged frame (no
    /// allocation per frame once the stream runs; `buf` holds an old
    /// frame's bytes). `progress(acked)` is called now and then.
    pub fn stream_into(
        &mut self,
        plan: &StreamPlan<'_>,
        mut fill: impl FnMut(u64, &mut Vec<u8>),
        mut progress: impl FnMut(u64),
    ) -> Result<()> {
        let StreamPlan {
            frames,
            channels,
            queue,
            timeout,
        } = *plan;
        let end = Instant::now() + timeout;
        let submitted = self.stats().requester.submitted;
        let first = self.cfg.first_seq + submitted;
        let acked = |e: &Self| e.stats().requester.acked - submitted;
        let every = self.cfg.restart_after.unwrap_or(u64::MAX).max(1);
        let mut restart_at = every;
        let mut next = 0u64;
        let mut last_report = Instant::now();
        let chans = if channels.is_empty() {
            &[0u8][..]
        } else {
            channels
        };
        let pace = Pace::new(self.cfg.rate);
        while next < frames || !self.req.is_idle() {
            if next == restart_at && next < frames && self.req.is_idle() {
                self.restart();
                restart_at = restart_at.saturating_add(every);
            }
            // Up to the next restart point: everything before it gets ACKed
            // first; paced: only the frames due by now.
            let upto = frames.min(restart_at).min(pace.due());
            while next < upto && self.req.outstanding() < queue.max(1) {
                let mut buf = self.req.take_spent().unwrap_or_default();
                fill(first + next, &mut buf);
                let channel = chans[(next % chans.len() as u64) as usize];
                self.submit(buf, channel);
                next += 1;
            }
            // Paced and ahead of time: look for ACKs without waiting.
            let ahead = next < frames.min(restart_at) && next >= upto;
            self.pump(if ahead {
                Duration::ZERO
            } else {
                Duration::from_millis(10)
            })?;
            if last_report.elapsed() > Duration::from_millis(100) {
                progress(acked(self));
                last_report = Instant::now();
            }
            if Instant::now() >= end {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "FPGA emulator: {} of {frames} frames acknowledged after {timeout:?}",
                        acked(self)
                    ),
                ));
            }
        }
        progress(acked(self));
        Ok(())
    }
}
