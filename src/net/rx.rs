//! The receive side of [`UdpIo`]: recvmmsg into staging buffers and slab
//! slots, with merged datagrams (UDP GRO, or a GSO super-packet seen by raw
//! capture) split into their segments.
//!
//! One recvmmsg entry ([`RxMsg`]) receives one datagram, which may hold
//! several equal-size *segments* (packets) back to back. A batch is read as
//! a flat list of segments ([`Seg`]); the soft backend sees each as one
//! packet, whatever the kernel merged.
//!
//! Scatter layout of an entry with planned landings `L0..Lk-1` (each
//! segment: headers, payload, pad + ICRC):
//!
//! ```text
//! stage[chunk 0]: prefix + head0 | slot L0: payload0 | stage[chunk 1]: tail0 + head1 |
//! slot L1: payload1 | ... | slot Lk-1: payload (up to its slot room) | spill
//! ```
//!
//! Segment `j` landed as planned when it starts where that layout put its
//! headers; anything else (a size or count other than planned) is read back
//! by [`UdpIo::gather`] and copied, never lost.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;

use super::datagram::{Body, Datagram};
use super::{iovec, to_v4, Landing, UdpIo, MAX_DATAGRAM};
use crate::error::{Error, ErrorKind, Result};
use crate::server::Slab;
use crate::wire::icrc::{parse_ipv4_udp, Ipv4Udp};

/// Largest datagram received whole: 64 KiB of UDP payload (a merged one).
const MAX_MERGED: usize = 65536;
/// Segments of one merged datagram planned at most (the kernel merges up
/// to 64: UDP_GRO_CNT_MAX).
pub(crate) const MAX_SEGS: usize = 64;
/// Staging bytes per planned segment: the previous segment's pad + ICRC
/// and this one's headers (chunk 0: the raw-capture prefix and headers).
const CHUNK: usize = 128;
/// Raw capture: the virtio-net header in front of each packet (it says
/// whether and how a GSO super-packet is segmented).
pub(super) const VNET_LEN: usize = 10;
/// virtio-net `gso_type` of a UDP GSO packet.
const VNET_GSO_UDP_L4: u8 = 5;
/// Raw capture: where the IP header starts (behind the virtio-net header
/// and the Ethernet header: the capture reads Ethernet and loopback links).
const IP_AT: usize = VNET_LEN + 14;
/// Bytes in front of the UDP payload in a raw capture: the virtio-net
/// header, Ethernet, IPv4 (no options), UDP.
pub(super) const RAW_PREFIX: usize = IP_AT + 28;
/// Room for the control messages: UDP_GRO (24 bytes) and SCM_TIMESTAMPNS
/// (32 bytes).
const CTRL_LEN: usize = 64;

/// A planned segment of an entry: where it lands and where its bytes start
/// in the datagram (after the prefix).
#[derive(Debug, Clone, Copy)]
struct Planned {
    l: Landing,
    start: usize,
    /// Its headers in `stage`.
    head_at: usize,
    /// Where the bytes after its slot part go: `stage` offset, or `None`
    /// for the spill buffer.
    rest_at: Option<usize>,
}

/// One recvmmsg entry: its buffers, where the last call aimed it, and what
/// it received.
pub(super) struct RxMsg {
    /// Whole-datagram receive buffer (unplanned), and where a scattered
    /// datagram is gathered.
    lin: Vec<u8>,
    /// Headers and tails of planned segments, CHUNK bytes each.
    stage: Vec<u8>,
    /// What follows the last planned segment's slot part.
    spill: Vec<u8>,
    iov: Vec<libc::iovec>,
    planned: Vec<Planned>,
    /// True while its pieces are in stage / slots / spill (not gathered).
    scattered: bool,
    /// Bytes in front of the UDP payload (raw capture: RAW_PREFIX).
    pre: usize,
    /// Bytes received, prefix included.
    got: usize,
    /// UDP payload bytes and their segment size (= the payload when not merged).
    payload: usize,
    seg_size: usize,
    from: SocketAddrV4,
    truncated: bool,
    /// Raw capture: the first segment's ICRC context.
    ctx: Option<Ipv4Udp>,
    name: libc::sockaddr_in,
    ctrl: [u64; CTRL_LEN / 8],
    /// The kernel's receive stamp (0: none asked for).
    stamp_ns: u64,
}

/// One segment (packet) of the last batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seg {
    /// Its datagram's entry.
    pub(super) msg: u16,
    /// Its index in its datagram, and where it starts there (after the prefix).
    k: u16,
    at: u32,
    len: u32,
    /// The planned segment it landed as, while its entry is scattered.
    planned: Option<u16>,
}

impl RxMsg {
    pub(super) fn new() -> RxMsg {
        RxMsg {
            lin: vec![0u8; MAX_MERGED + CHUNK],
            stage: vec![0u8; MAX_SEGS * CHUNK],
            spill: vec![0u8; MAX_MERGED + CHUNK],
            iov: Vec::with_capacity(2 * MAX_SEGS + 2),
            planned: Vec::with_capacity(MAX_SEGS),
            scattered: false,
            pre: 0,
            got: 0,
            payload: 0,
            seg_size: 0,
            from: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            truncated: false,
            ctx: None,
            // SAFETY: plain-data struct; zeroed is a valid initial value.
            name: unsafe { std::mem::zeroed() },
            ctrl: [0; CTRL_LEN / 8],
            stamp_ns: 0,
        }
    }

    /// Points the iovecs at `lin` (no landings) or lays out `landings`
    /// (each with its slab range) as the module doc shows.
    fn aim(&mut self, prefix: usize, landings: &[(Landing, NonNull<u8>)]) {
        self.pre = prefix;
        self.iov.clear();
        self.planned.clear();
        self.scattered = !landings.is_empty();
        if landings.is_empty() {
            self.iov
                .push(iovec(self.lin.as_mut_ptr(), MAX_MERGED + prefix));
            return;
        }
        let stage = self.stage.as_mut_ptr();
        let (mut start, mut chunk_start, mut chunk_len) = (0usize, 0usize, prefix);
        for (j, &(l, body)) in landings.iter().enumerate() {
            let last = j + 1 == landings.len();
            let head_at = chunk_start + chunk_len;
            chunk_len += l.head as usize;
            // SAFETY: chunk_start + chunk_len <= MAX_SEGS * CHUNK: j < MAX_SEGS,
            // and a chunk holds at most RAW_PREFIX + head or 7 + head bytes,
            // head <= CHUNK - RAW_PREFIX - 8 (checked by the caller).
            self.iov
                .push(iovec(unsafe { stage.add(chunk_start) }, chunk_len));
            // Up to the last planned segment each carries exactly what it
            // should; the last may carry up to its slot room.
            let body_len = if last { l.len } else { l.expect } as usize;
            self.iov.push(iovec(body.as_ptr(), body_len));
            let tail = tail_len(l.expect);
            let rest_at = (!last).then_some((j + 1) * CHUNK);
            self.planned.push(Planned {
                l: Landing {
                    len: body_len as u32,
                    ..l
                },
                start,
                head_at,
                rest_at,
            });
            start += l.head as usize + body_len + tail;
            chunk_start = (j + 1) * CHUNK;
            chunk_len = tail;
        }
        self.iov
            .push(iovec(self.spill.as_mut_ptr(), MAX_MERGED + prefix));
    }

    /// After recvmmsg: lengths, sender, segment size.
    fn read(
        &mut self,
        got: usize,
        flags: i32,
        ctrl_len: usize,
        raw: bool,
        slab: Option<&Slab>,
    ) -> Result<()> {
        self.got = got;
        self.truncated = flags & libc::MSG_TRUNC != 0;
        self.ctx = None;
        let c = cmsgs(&self.ctrl, ctrl_len);
        self.stamp_ns = c.stamp_ns;
        if raw {
            if self.raw_needs_gather() {
                if let Some(slab) = slab {
                    self.gather(slab)?;
                }
            }
            self.read_raw();
            return Ok(());
        }
        self.from = to_v4(&self.name);
        self.payload = got;
        self.seg_size = c.gro_segment.unwrap_or(got).max(1);
        // A single datagram longer than the largest packet is not RoCE.
        if self.seg_size > MAX_DATAGRAM {
            self.truncated = true;
        }
        Ok(())
    }

    /// Raw capture: an IP header with options shifts the layout of a
    /// scattered packet: it must be gathered before it is read.
    fn raw_needs_gather(&self) -> bool {
        self.scattered && self.got > IP_AT && self.stage[IP_AT] != 0x45
    }

    /// Raw capture: the virtio-net header and IP/UDP header -> sender,
    /// payload length, segment size, the ICRC context.
    fn read_raw(&mut self) {
        let hdr = if self.scattered {
            &self.stage
        } else {
            &self.lin
        };
        let len = self.got;
        let seen = if self.scattered {
            len.min(self.pre + self.planned[0].l.head as usize)
        } else {
            len
        };
        let parsed = (len >= IP_AT)
            .then(|| parse_ipv4_udp(&hdr[IP_AT..seen.max(IP_AT)], len - IP_AT))
            .flatten();
        match parsed {
            Some((ctx, at, n)) if !self.scattered || IP_AT + at == self.pre => {
                let gso = (hdr[1] == VNET_GSO_UDP_L4)
                    .then(|| u16::from_le_bytes([hdr[4], hdr[5]]) as usize);
                self.pre = IP_AT + at;
                self.payload = n;
                self.seg_size = gso.filter(|&g| g > 0).unwrap_or(n).max(1);
                self.from = SocketAddrV4::new(ctx.src, ctx.src_port);
                self.ctx = Some(ctx);
                self.truncated = self.seg_size > MAX_DATAGRAM;
            }
            _ => {
                self.payload = 0;
                self.seg_size = 1;
                self.from = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
                self.truncated = true;
            }
        }
    }

    /// The segments of what was received, appended to `segs`.
    fn segments(&self, msg: usize, segs: &mut Vec<Seg>) {
        if self.truncated || self.payload == 0 {
            segs.push(Seg {
                msg: msg as u16,
                k: 0,
                at: 0,
                len: 0,
                planned: None,
            });
            return;
        }
        let (mut at, mut k) = (0usize, 0usize);
        while at < self.payload {
            let len = self.seg_size.min(self.payload - at);
            let planned = if self.scattered {
                self.planned
                    .get(k)
                    .filter(|p| p.start == at && len >= p.l.head as usize)
                    .map(|_| k as u16)
            } else {
                None
            };
            segs.push(Seg {
                msg: msg as u16,
                k: k as u16,
                at: at as u32,
                len: len as u32,
                planned,
            });
            at += len;
            k += 1;
        }
    }

    /// Segment `s` of what was received, as a [`Datagram`].
    pub(super) fn datagram(&self, s: Seg) -> Datagram<'_> {
        let n = s.len as usize;
        let body = match (self.scattered, s.planned) {
            (true, Some(j)) => {
                let p = self.planned[j as usize];
                let head = n.min(p.l.head as usize);
                let rest = n - head - (n - head).min(p.l.len as usize);
                let tail = match p.rest_at {
                    Some(o) => &self.stage[o..o + rest],
                    None => &self.spill[..rest],
                };
                Body::Landed {
                    head: &self.stage[p.head_at..p.head_at + head],
                    landing: p.l,
                    tail,
                }
            }
            // Not landed and not gathered: nothing readable yet.
            (true, None) => Body::Scattered,
            (false, _) => {
                let at = self.pre + s.at as usize;
                Body::Whole(&self.lin[at..at + n])
            }
        };
        Datagram {
            from: self.from,
            truncated: self.truncated,
            rx_ns: self.stamp_ns,
            len: n,
            body,
            starts_merge: s.k == 0 && self.payload > self.seg_size,
            // Segment k of a GSO packet: the IP ID segmentation gives it.
            icrc: self.ctx.map(|c| Ipv4Udp {
                ip_id: c.ip_id.wrapping_add(s.k),
                ..c
            }),
        }
    }

    /// Copies the received bytes back together in `lin`, in the order the
    /// iovecs laid them out: stage chunks, slot parts, spill.
    fn gather(&mut self, slab: &Slab) -> Result<()> {
        if !self.scattered {
            return Ok(());
        }
        let (mut out, mut left) = (0usize, self.got.min(self.lin.len()));
        let pieces = self.iov.len();
        for idx in 0..pieces {
            if left == 0 {
                break;
            }
            let n = self.iov[idx].iov_len.min(left);
            if idx % 2 == 1 {
                let l = self.planned[idx / 2].l;
                let src = slab
                    .receive_region(l.slot, l.offset, n as u32)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Internal,
                            format!(
                                "slot {} was loaned before its scattered datagram was read",
                                l.slot
                            ),
                        )
                    })?;
                // SAFETY: receive_region vouched for `n` bytes of a receiver-
                // owned range (the kernel wrote them in the last recvmmsg;
                // nobody writes them now); `lin` is our own buffer, disjoint.
                let part = unsafe { std::slice::from_raw_parts(src.as_ptr(), n) };
                self.lin[out..out + n].copy_from_slice(part);
            } else if idx + 1 == pieces {
                self.lin[out..out + n].copy_from_slice(&self.spill[..n]);
            } else {
                let at = idx / 2 * CHUNK;
                self.lin[out..out + n].copy_from_slice(&self.stage[at..at + n]);
            }
            out += n;
            left -= n;
        }
        self.scattered = false;
        Ok(())
    }
}

/// Pad + ICRC after a payload of `len` bytes.
fn tail_len(len: u32) -> usize {
    (4 - len as usize % 4) % 4 + crate::wire::ICRC_LEN
}

/// What a datagram's control messages say: its UDP_GRO segment size (when
/// it was merged) and the kernel's receive stamp (SCM_TIMESTAMPNS,
/// CLOCK_REALTIME ns; 0 when the socket does not ask for one).
#[derive(Debug, Default, PartialEq, Eq)]
struct Cmsgs {
    gro_segment: Option<usize>,
    stamp_ns: u64,
}

/// Walks a control buffer's messages (`len` bytes of `ctrl` used).
fn cmsgs(ctrl: &[u64], len: usize) -> Cmsgs {
    // struct cmsghdr { size_t len; int level; int type; } then the data.
    let bytes: &[u8] = bytemuck_u64(ctrl);
    let mut out = Cmsgs::default();
    let mut at = 0usize;
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let word = |at: usize, n: usize| bytes.get(at..at + n);
    while at + hdr <= len.min(bytes.len()) {
        let (Some(l), Some(lv), Some(t)) = (word(at, 8), word(at + 8, 4), word(at + 12, 4)) else {
            break;
        };
        let clen = usize::from_ne_bytes(l.try_into().unwrap_or_default());
        let level = i32::from_ne_bytes(lv.try_into().unwrap_or_default());
        let ty = i32::from_ne_bytes(t.try_into().unwrap_or_default());
        if clen < hdr || at + clen > bytes.len() {
            break;
        }
        let data = &bytes[at + hdr..at + clen];
        if level == libc::SOL_UDP && ty == libc::UDP_GRO && data.len() >= 4 {
            let v = i32::from_ne_bytes(data[..4].try_into().unwrap_or_default());
            out.gro_segment = usize::try_from(v).ok();
        } else if level == libc::SOL_SOCKET && ty == libc::SCM_TIMESTAMPNS && data.len() >= 16 {
            // struct timespec { time_t tv_sec; long tv_nsec; } (64-bit).
            let sec = i64::from_ne_bytes(data[..8].try_into().unwrap_or_default());
            let nsec = i64::from_ne_bytes(data[8..16].try_into().unwrap_or_default());
            out.stamp_ns = (sec as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(nsec as u64);
        }
        at += (clen + 7) & !7;
    }
    out
}

fn bytemuck_u64(v: &[u64]) -> &[u8] {
    // SAFETY: u64s are plain bytes; the slice covers exactly their storage.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

impl UdpIo {
    /// Receives up to the batch size of datagrams without blocking; returns
    /// how many segments (packets) they hold (0 when none is waiting). Each
    /// lands whole in its entry's buffer.
    pub fn recv_batch(&mut self) -> Result<usize> {
        self.recv_batch_into(None, None)
    }

    /// Like [`recv_batch`](Self::recv_batch), but the next packets are
    /// scattered as `plan` says (`None`: as the last call planned; nothing
    /// changed since): each payload goes straight from the socket into the
    /// slab, no second copy. A landing whose slab range is not
    /// receiver-owned (loaned, or outside its slot) ends the plan there.
    pub(crate) fn recv_batch_into(
        &mut self,
        slab: Option<&Slab>,
        plan: Option<&[Landing]>,
    ) -> Result<usize> {
        if let Some(p) = plan {
            self.kept.clear();
            self.kept.extend_from_slice(p);
            self.aimed = None;
        }
        let Some(raw) = self.raw.as_ref().map(|r| r.as_raw_fd()) else {
            return self.recv_on(self.sock.as_raw_fd(), false, slab);
        };
        let got = self.recv_on(raw, true, slab)?;
        if got > 0 {
            return Ok(got);
        }
        // The capture is idle: anything that came in elsewhere? Now and
        // then, and read only when there is (reading re-aims the entries).
        self.fallback_ticks = self.fallback_ticks.wrapping_add(1);
        if self.fallback_ticks % 16 != 0
            || !crate::sys::poll_readable([self.sock.as_raw_fd()], 0).is_ok_and(|r| r[0])
        {
            return Ok(0);
        }
        // Whole, unplanned: aimed anew for the capture next time.
        self.aimed = None;
        let got = self.recv_on(self.sock.as_raw_fd(), false, None)?;
        self.aimed = None;
        if got > 0 {
            if self.via_udp == 0 {
                log::warn!(
                    "packets for {} arrive through another interface than the captured one: \
                     their ICRC is not checked (counted icrc_unchecked)",
                    self.local_addr().map(|a| a.to_string()).unwrap_or_default()
                );
            }
            self.via_udp += got as u64;
        }
        Ok(got)
    }

    /// Aims the entries for the kept plan on `fd` (unless they are aimed
    /// for it already); without a slab, whole.
    fn aim_all(&mut self, fd: RawFd, raw: bool, slab: Option<&Slab>) {
        if self.aimed == Some(fd) {
            return;
        }
        let kept = std::mem::take(&mut self.kept);
        let plan = if slab.is_some() { &kept[..] } else { &[][..] };
        let prefix = if raw { RAW_PREFIX } else { 0 };
        let per_msg = self.per_entry();
        let msgs = self.want.clamp(1, self.rx.len());
        let mut next = plan.iter().peekable();
        let mut ranges = std::mem::take(&mut self.ranges);
        let split_mid = self.split_mid;
        for (rx, m) in self.rx.iter_mut().zip(self.msgs.iter_mut()).take(msgs) {
            ranges.clear();
            if let Some(slab) = slab {
                while ranges.len() < per_msg {
                    // Merged datagrams lately began mid-message (a NIC's GRO
                    // merges a LAST with the next FIRST, which is shorter):
                    // each entry does too.
                    match next.peek() {
                        Some(l) if !(split_mid && !ranges.is_empty() && l.offset > 0) => {}
                        _ => break,
                    }
                    let Some(l) = next.next() else { break };
                    let fits = l.head as usize <= CHUNK - RAW_PREFIX - 8 && l.expect <= l.len;
                    match fits
                        .then(|| slab.receive_region(l.slot, l.offset, l.len))
                        .flatten()
                    {
                        Some(p) => ranges.push((*l, p)),
                        None => break,
                    }
                }
            }
            rx.aim(prefix, &ranges);
            let m = &mut m.msg_hdr;
            if raw {
                // The sender's address is read from the IP header.
                m.msg_name = std::ptr::null_mut();
                m.msg_namelen = 0;
            } else {
                m.msg_name = &mut rx.name as *mut _ as *mut libc::c_void;
                m.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            }
            m.msg_iov = rx.iov.as_mut_ptr();
            m.msg_iovlen = rx.iov.len();
            m.msg_control = rx.ctrl.as_mut_ptr() as *mut libc::c_void;
            m.msg_controllen = CTRL_LEN;
            m.msg_flags = 0;
        }
        self.ranges = ranges;
        self.kept = kept;
        self.vlen = msgs;
        self.aimed = Some(fd);
    }

    fn recv_on(&mut self, fd: RawFd, raw: bool, slab: Option<&Slab>) -> Result<usize> {
        self.aim_all(fd, raw, slab);
        // SAFETY: msgs holds vlen entries pointing into `rx` (iovecs, name,
        // control buffer), which outlives the call; each iovec points into a
        // buffer we own or into a slab range that `receive_region` vouched
        // is receiver-owned (the receive thread, our only caller, loans no
        // slot before it has read this batch, and re-aims after any change).
        let got = unsafe {
            libc::recvmmsg(
                fd,
                self.msgs.as_mut_ptr(),
                self.vlen as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(0),
                // A previous send to a closed port reports ECONNREFUSED here.
                std::io::ErrorKind::ConnectionRefused => Ok(0),
                _ => Err(Error::io("recvmmsg", e)),
            };
        }
        // The kernel rewrote what it filled (and scattered entries pointed
        // into slots the batch now fills): aim again next time. (Keeping
        // whole-datagram entries aimed measured slower: the raw-capture demo
        // fell from 175k to 115k frames/s.)
        self.aimed = None;
        self.drained = (got as usize) < self.vlen;
        self.fit_entries(got as usize);
        self.segs.clear();
        let mut merged = 0usize;
        for i in 0..got as usize {
            let h = &mut self.msgs[i];
            let (len, flags, clen) = (
                h.msg_len as usize,
                h.msg_hdr.msg_flags,
                h.msg_hdr.msg_controllen,
            );
            // Restored for the next call (the kernel wrote what it used).
            h.msg_hdr.msg_controllen = CTRL_LEN;
            let rx = &mut self.rx[i];
            rx.read(len, flags, clen, raw, slab)?;
            let segs = rx.payload.div_ceil(rx.seg_size).max(1);
            if segs > 1 {
                merged = merged.max(segs);
            }
            // Segments per datagram, averaged (x16, weight 1/8).
            self.merge_avg16 += (segs * 16).saturating_sub(self.merge_avg16) / 8;
            self.merge_avg16 -= self.merge_avg16.saturating_sub(segs * 16) / 8;
            rx.segments(i, &mut self.segs);
        }
        self.note_merges(merged, raw);
        Ok(self.segs.len())
    }

    /// Copies segment `i`'s datagram back together (the slow path when a
    /// landing guess was wrong); afterwards [`datagram`](Self::datagram)
    /// returns its segments whole. Fails if a slab range it landed in is no
    /// longer receiver-owned.
    pub(crate) fn gather(&mut self, i: usize, slab: &Slab) -> Result<()> {
        let m = self.segs[i].msg as usize;
        self.rx[m].gather(slab)
    }

    /// Gathers the datagrams of segments `from..n` of the last batch (a
    /// landing guess missed at `from`: the rest is read the slow way before
    /// any copy into the slab can overwrite where they landed).
    pub(crate) fn gather_rest(&mut self, from: usize, n: usize, slab: &Slab) -> Result<()> {
        (from..n).try_for_each(|j| self.gather(j, slab))
    }
}
