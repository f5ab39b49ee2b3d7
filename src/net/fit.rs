//! How much the next receive plans for: entries aimed (`fit_entries`) and
//! segments per entry (merged datagrams lately); UDP GRO; whether the last
//! receive emptied the socket.

use std::os::fd::AsRawFd;

use super::rx::MAX_SEGS;
use super::UdpIo;

impl UdpIo {
    /// The last receive got fewer datagrams than it asked for (so the
    /// socket was empty at that moment).
    pub(crate) fn drained(&self) -> bool {
        self.drained
    }

    /// Turns UDP GRO on for the receiving UDP socket: the kernel may then
    /// hand over equal-size packets of a flow merged into one datagram,
    /// which is read as its segments. False when the kernel refuses.
    pub fn enable_gro(&mut self) -> bool {
        let ok = super::setsockopt_int(
            self.sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            1,
            "setsockopt(UDP_GRO)",
        )
        .is_ok();
        self.gro = ok;
        ok
    }

    /// How many landings the next receive can use: segments per entry (up
    /// to MAX_SEGS after merged datagrams arrived, else one) times the
    /// entries aimed.
    pub(crate) fn plan_capacity(&self) -> usize {
        self.per_entry() * self.want.min(self.rx.len())
    }

    /// Entries aimed per receive follow what arrives: twice as many after a
    /// receive that filled them all, one fewer after one that did not (never
    /// under 2 or one more than it got). Aiming all 32 entries, each for
    /// several packets, when a paced link brings one datagram per wake-up
    /// cost the receive thread more than the receive did.
    pub(super) fn fit_entries(&mut self, got: usize) {
        if got == 0 {
            return;
        }
        self.want = if got >= self.vlen {
            (self.vlen * 2).min(self.rx.len())
        } else {
            self.want.saturating_sub(1).max(got + 1).max(2)
        };
    }

    /// Segments planned per entry once merged datagrams arrive: the last
    /// batch's largest merge, or a quarter more than the recent average
    /// merge plus one if that is more (an entry that gets fewer leaves its
    /// last landings unused: the next entry's packets still land in posted
    /// slots, which the responder takes as they come; more than planned are
    /// copied), else one. Planning far more than arrives would use the
    /// posted slots up in the first entries and leave the rest of a batch of
    /// small merges unplanned.
    pub(super) fn per_entry(&self) -> usize {
        if self.merging {
            let avg = self.merge_avg16 * 5 / 64 + 1;
            avg.max(self.merge_last).clamp(1, MAX_SEGS)
        } else {
            1
        }
    }

    /// Plans one entry of many segments after a merged datagram, and goes
    /// back to one packet per entry only after 64 batches in a row without
    /// one (a sender that merges now and then should not flip the plan).
    pub(super) fn note_merges(&mut self, merged: usize, raw: bool) {
        if merged > 0 && (self.gro || raw) {
            self.merging = true;
            self.merge_last = merged;
            self.unmerged_batches = 0;
        } else if self.merging {
            self.unmerged_batches += 1;
            if self.unmerged_batches >= 64 {
                self.merging = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};

    #[test]
    fn entries_aimed_follow_what_arrives() {
        let mut io = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 32).unwrap();
        assert_eq!(io.plan_capacity(), 32, "all 32 entries, one packet each");
        let got = |io: &mut UdpIo, n: usize| {
            io.vlen = io.want.clamp(1, 32);
            io.fit_entries(n);
            io.want
        };
        // One datagram per receive: down by one each time, to 2.
        assert_eq!(got(&mut io, 1), 31);
        for _ in 0..40 {
            got(&mut io, 1);
        }
        assert_eq!(io.want, 2);
        assert_eq!(io.plan_capacity(), 2);
        // Nothing arrived: unchanged. A receive that filled them all: doubled.
        assert_eq!(got(&mut io, 0), 2);
        assert_eq!(got(&mut io, 2), 4);
        assert_eq!(got(&mut io, 4), 8);
        assert_eq!(got(&mut io, 8), 16);
        assert_eq!(got(&mut io, 16), 32);
        assert_eq!(got(&mut io, 32), 32, "never above the batch");
        // Fewer: never under one more than arrived.
        assert_eq!(got(&mut io, 20), 31);
        assert_eq!(got(&mut io, 30), 31);
    }
}
