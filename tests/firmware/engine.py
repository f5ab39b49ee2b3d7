"""Drives surf's RoCEv2 engine (Verilog top mkAxiSTransportLayer) under cocotb:
the metadata bus (PD / MR / QP bring-up, as pyrogue's RoCEv2Server does it),
work requests, the DMA read port (answered with the project's frame pattern),
work completions, and a UDP bridge between the engine's packet streams and a
rocev2 server on loopback (the bridge adds / checks the iCRC).

One coroutine (`Engine.run`) serves every port once per clock edge: signals are
sampled at the rising edge (the values the engine saw), inputs are driven for
the next edge. Scenario hooks (`Bridge`) drop, duplicate or hold packets.
"""
from __future__ import annotations

import functools
import random
import socket
import struct
import zlib

import cocotb
from cocotb.triggers import RisingEdge

# ---------------------------------------------------------------------------
# The project's frame pattern (src/soft/pattern.rs; rocev2.pattern_check)
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def pattern_bytes(seq: int, length: int) -> bytes:
    """Frame `seq` of `length` bytes: seq little-endian in bytes 0..8 (cut to
    the frame), then the xorshift32 stream seeded from seq."""
    head = seq.to_bytes(8, "little")[: min(8, length)]
    s = ((seq * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF) >> 32) | 1
    out = bytearray(head)
    while len(out) < length:
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        out += s.to_bytes(4, "little")
    return bytes(out[:length])


# ---------------------------------------------------------------------------
# Metadata bus codec (field widths of surf's engine with 1 PD, 2 MRs, 1 QP;
# the layout pyrogue used: fields MSB-first packed into the low bits, bus type
# in the top two bits). Request 303 bits, response 276 bits.
# ---------------------------------------------------------------------------
REQ_BITS = 303
PD_T, MR_T, QP_T = 0, 1, 2
QP_CREATE, QP_MODIFY = 0, 2
QPS_INIT, QPS_RTR, QPS_RTS = 1, 2, 3
QPT_RC = 2
# ibv_qp_attr_mask bits
M_STATE, M_ACCESS, M_PKEY, M_PMTU, M_TIMEOUT = 1, 8, 16, 256, 512
M_RETRY, M_RNR_RETRY, M_RQ_PSN, M_MAX_RD, M_MIN_RNR = 1024, 2048, 4096, 8192, 32768
M_SQ_PSN, M_MAX_DEST_RD, M_DEST_QPN = 65536, 131072, 1048576


def pack(bus_type: int, fields) -> int:
    acc = 0
    for value, width in fields:
        acc = (acc << width) | (int(value) & ((1 << width) - 1))
    return acc | (bus_type << (REQ_BITS - 2))


def req_alloc_pd(pd_key: int) -> int:
    return pack(PD_T, [(1, 1), (pd_key, 32), (0, 32)])


def req_alloc_mr(pd: int, laddr: int, length: int, lkey_part: int, rkey_part: int) -> int:
    return pack(MR_T, [(1, 1), (laddr, 64), (length, 32), (0x0F, 8), (pd, 32),
                       (lkey_part, 31), (rkey_part, 31), (0, 1), (0, 32), (0, 32)])


def req_qp(req_type: int, pd: int, qpn: int, mask: int, state: int = 0, pmtu: int = 0,
           rq_psn: int = 0, sq_psn: int = 0, dqpn: int = 0, min_rnr: int = 0,
           timeout: int = 0, retry: int = 0, rnr_retry: int = 0) -> int:
    return pack(QP_T, [
        (req_type, 2), (pd, 32), (qpn, 24), (mask, 26),
        (state, 4), (0, 4), (pmtu, 3), (0, 32), (rq_psn, 24), (sq_psn, 24), (dqpn, 24),
        (0x0E, 8), (0x2020010100, 40), (0xFFFF, 16), (0, 1), (16, 8), (16, 8),
        (min_rnr, 5), (timeout, 5), (retry, 3), (rnr_retry, 3),
        (QPT_RC, 4), (0, 1)])


def resp_type(rx: int) -> int:
    return (rx >> 274) & 3


def resp_pd(rx: int):
    return bool(rx >> 64 & 1), rx >> 32 & 0xFFFFFFFF


def resp_mr(rx: int):
    ok_bit = 32 + 32 + 31 + 31 + 32 + 8 + 32 + 64
    return bool(rx >> ok_bit & 1), rx >> 32 & 0xFFFFFFFF


def resp_qp(rx: int):
    return bool(rx >> 273 & 1), rx >> 249 & 0xFFFFFF, rx >> 213 & 0xF


# ---------------------------------------------------------------------------
# RoCEv2 wire bits the bridge needs
# ---------------------------------------------------------------------------
ACK_OPCODE = 0x11


def icrc(src_ip: bytes, dst_ip: bytes, sport: int, dport: int, ib: bytes) -> bytes:
    """iCRC of one packet (BTH onwards, without iCRC) as Linux sends it from an
    unconnected IP_PMTUDISC_DO socket: IP ID 0, DF set; variant fields masked."""
    udp_len = 8 + len(ib) + 4
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0xFF, 20 + udp_len, 0, 0x4000, 0xFF, 17, 0xFFFF,
                     src_ip, dst_ip)
    udp = struct.pack(">HHHH", sport, dport, udp_len, 0xFFFF)
    masked = ib[:4] + b"\xff" + ib[5:]
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + ip + udp + masked) & 0xFFFFFFFF)


def psn_of(pkt: bytes) -> int:
    return int.from_bytes(pkt[9:12], "big")


def psn_diff(a: int, b: int) -> int:
    d = (a - b) & 0xFFFFFF
    return d - (1 << 24) if d >= 1 << 23 else d


# ---------------------------------------------------------------------------
# The bridge: engine packets <-> UDP, with scenario hooks
# ---------------------------------------------------------------------------


class Bridge:
    """Default policy: forward everything at once. Scenarios subclass it."""

    def on_data(self, eng: "Engine", n: int, pkt: bytes):
        """The engine's n-th packet (0-based). Returns the packets to send now."""
        return [pkt]

    def on_acks(self, eng: "Engine", acks):
        """Host replies collected in one poll. Returns those to feed the engine."""
        return acks

    def tick(self, eng: "Engine"):
        """Every poll: packets held back to release now."""
        return []


# ---------------------------------------------------------------------------
# The engine driver
# ---------------------------------------------------------------------------
MR_BASE = 0x1000_0000
MR_LEN = 0x1000_0000
SLOT = 1 << 16  # each frame's buffer in engine memory: MR_BASE + seq * SLOT


class Engine:
    POLL = 16  # cycles between socket polls

    def __init__(self, dut, server, bridge: Bridge | None = None):
        self.dut = dut
        self.server = server
        self.bridge = bridge or Bridge()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.host = ("127.0.0.1", server.udp_port)
        self.lo = socket.inet_aton("127.0.0.1")
        self.port = self.sock.getsockname()[1]
        self.cycle = 0
        self.running = True
        # queues / state
        self.meta_req = None
        self.meta_resp = None
        self.wr_queue = []          # (seq, len, imm)
        self.frames = {}            # seq -> length, for DMA
        self.dma_reqs = []          # pending DMA requests
        self.dma_beats = []         # beats of the one being answered
        self.ack_queue = []         # host replies to feed in (bytes BTH+AETH)
        self.rx_beats = bytearray()
        self.completions = []       # (wr_id, status, cycle)
        # observations
        self.sent_pkts = 0          # packets the engine emitted
        self.psns_seen = set()
        self.retransmits = 0
        self.psn_wrapped = False
        self.max_psn = None
        self.acks_in = []           # (syndrome, psn) fed to the engine
        self.host_replies = []      # (syndrome, psn) the host sent
        self.icrc_bad = 0
        self.msg_end_psns = []      # PSN of the last packet of each message, in order
        self.max_unacked_msgs = 0
        self.last_ack_psn = None
        self.on_poll = None         # scenario consumer hook
        # the valid inputs as last driven (written only on change)
        self.wr_valid = self.ack_valid = self.meta_valid = self.dma_valid = False

    # -- bring-up -----------------------------------------------------------
    async def reset(self):
        d = self.dut
        for name in ("s_work_req_valid", "s_data_stream_tvalid", "s_meta_data_tvalid",
                     "s_dma_read_valid"):
            getattr(d, name).value = 0
        for name in ("m_data_stream_tready", "m_work_comp_sq_ready", "m_meta_data_tready",
                     "m_dma_read_ready"):
            getattr(d, name).value = 1
        d.s_dma_read_is_resp_err.value = 0
        d.RST_N.value = 0
        for _ in range(4):
            await RisingEdge(d.CLK)
        d.RST_N.value = 1
        await RisingEdge(d.CLK)

    async def meta(self, req: int) -> int:
        self.meta_req, self.meta_resp = req, None
        start = self.cycle
        while self.meta_resp is None:
            await RisingEdge(self.dut.CLK)
            if self.cycle - start > 5000:
                raise AssertionError("engine did not answer a metadata request in 5000 cycles")
        return self.meta_resp

    async def bring_up(self, host_qpn: int, host_rq_psn: int, sq_psn: int, pmtu: int,
                       timeout: int, retry: int = 3, rnr_retry: int = 7, min_rnr: int = 1):
        """PD -> MR -> QP create -> INIT -> RTR -> RTS, as pyrogue does it."""
        rng = random.Random(7)
        rx = await self.meta(req_alloc_pd(rng.getrandbits(32)))
        ok, pd = resp_pd(rx)
        assert resp_type(rx) == PD_T and ok, f"PD alloc failed: {rx:#x}"
        rx = await self.meta(req_alloc_mr(pd, MR_BASE, MR_LEN, rng.getrandbits(31),
                                          rng.getrandbits(31)))
        ok, self.lkey = resp_mr(rx)
        assert resp_type(rx) == MR_T and ok, f"MR alloc failed: {rx:#x}"
        rx = await self.meta(req_qp(QP_CREATE, pd, 0, 0))
        ok, self.qpn, _ = resp_qp(rx)
        assert resp_type(rx) == QP_T and ok, f"QP create failed: {rx:#x}"
        steps = [
            (QPS_INIT, M_STATE | M_PKEY | M_ACCESS, {}),
            (QPS_RTR, M_STATE | M_PMTU | M_DEST_QPN | M_RQ_PSN | M_MAX_DEST_RD | M_MIN_RNR,
             dict(dqpn=host_qpn, rq_psn=host_rq_psn, min_rnr=min_rnr)),
            (QPS_RTS, M_STATE | M_SQ_PSN | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_MAX_RD,
             dict(sq_psn=sq_psn, timeout=timeout, retry=retry, rnr_retry=rnr_retry,
                  min_rnr=min_rnr)),
        ]
        for state, mask, kw in steps:
            rx = await self.meta(req_qp(QP_MODIFY, 0, self.qpn, mask, state=state, pmtu=pmtu, **kw))
            ok, _, got = resp_qp(rx)
            assert ok and got == state, f"QP -> state {state} failed (ok={ok}, state={got})"
        self.pmtu_bytes = 128 << pmtu
        self.next_psn = sq_psn

    async def reload(self, host_qpn: int, host_rq_psn: int, sq_psn: int, pmtu: int,
                     timeout: int, **kw):
        """An FPGA reload: once nothing is in flight on the driver's side, the
        engine is reset (RST_N) and brought up again through the metadata bus
        with these host params and first PSN `sq_psn`; the driver forgets the
        old stream's PSNs (the frames and completions stay)."""
        while self.wr_queue or self.dma_reqs or self.dma_beats or self.ack_queue:
            await RisingEdge(self.dut.CLK)
        await self.reset()
        self.rx_beats = bytearray()
        self.psns_seen.clear()
        self.max_psn = None
        self.msg_end_psns = []
        self.last_ack_psn = None
        self.first_psn = sq_psn
        await self.bring_up(host_qpn, host_rq_psn, sq_psn, pmtu, timeout, **kw)

    # -- work requests ------------------------------------------------------
    def post(self, seq: int, length: int, imm: int):
        """Queues a SEND_WITH_IMM of frame `seq` (pattern payload) with `imm`."""
        self.frames[seq] = length
        self.wr_queue.append((seq, length, imm))
        npk = max(1, -(-length // self.pmtu_bytes))
        self.next_psn = (self.next_psn + npk) & 0xFFFFFF
        self.msg_end_psns.append((self.next_psn - 1) & 0xFFFFFF)

    def _drive_wr(self):
        d = self.dut
        if not self.wr_queue:
            if self.wr_valid:
                d.s_work_req_valid.value = 0
                self.wr_valid = False
            return
        self.wr_valid = True
        seq, length, imm = self.wr_queue[0]
        d.s_work_req_id.value = seq
        d.s_work_req_op_code.value = 3           # SEND_WITH_IMM
        d.s_work_req_flags.value = 2             # signaled
        d.s_work_req_raddr.value = 0
        d.s_work_req_rkey.value = 0
        d.s_work_req_len.value = length
        d.s_work_req_laddr.value = MR_BASE + seq * SLOT
        d.s_work_req_lkey.value = self.lkey
        d.s_work_req_sqpn.value = self.qpn
        d.s_work_req_solicited.value = 0
        d.s_work_req_comp.value = 0
        d.s_work_req_swap.value = 0
        d.s_work_req_imm_dt.value = (1 << 32) | imm
        d.s_work_req_rkey_to_inv.value = 0
        d.s_work_req_srqn.value = 0
        d.s_work_req_dqpn.value = 0
        d.s_work_req_qkey.value = 0
        d.s_work_req_valid.value = 1

    # -- DMA reads ----------------------------------------------------------
    def _dma_beats(self, req):
        init, sqpn, wr_id, addr, length = req
        off = addr - MR_BASE
        seq, at = off // SLOT, off % SLOT
        assert seq in self.frames, f"DMA read of {addr:#x}: no frame posted there"
        assert at + length <= self.frames[seq], (
            f"DMA read of {length} B at offset {at} overruns frame {seq} "
            f"({self.frames[seq]} B)")
        data = pattern_bytes(seq, self.frames[seq])[at:at + length]
        beats = []
        for i in range(0, max(1, len(data)), 32):
            chunk = data[i:i + 32]
            n = len(chunk)
            word = int.from_bytes(chunk.ljust(32, b"\0"), "big")
            be = ((1 << n) - 1) << (32 - n)
            first, last = i == 0, i + 32 >= len(data)
            beats.append((word << 34) | (be << 2) | (int(first) << 1) | int(last))
        return [(init, sqpn, wr_id, b) for b in beats]

    # -- packets --------------------------------------------------------------
    def _engine_packet(self, pkt: bytes):
        n = self.sent_pkts
        self.sent_pkts += 1
        psn = psn_of(pkt)
        if psn in self.psns_seen:
            self.retransmits += 1
        self.psns_seen.add(psn)
        if self.max_psn is not None and psn_diff(psn, self.max_psn) > 0:
            if psn < self.max_psn:
                self.psn_wrapped = True
            self.max_psn = psn
        elif self.max_psn is None:
            self.max_psn = psn
        self._note_window()
        for p in self.bridge.on_data(self, n, pkt):
            self.send_to_host(p)

    def _note_window(self):
        """Largest number of messages started (a packet sent) and not yet
        acknowledged (cumulatively) at once: the engine's window in use."""
        starts = [self.first_psn] + [(e + 1) & 0xFFFFFF for e in self.msg_end_psns[:-1]]
        started = sum(1 for s in starts if psn_diff(s, self.max_psn) <= 0)
        acked = 0
        if self.last_ack_psn is not None:
            acked = sum(1 for e in self.msg_end_psns if psn_diff(e, self.last_ack_psn) <= 0)
        self.max_unacked_msgs = max(self.max_unacked_msgs, started - acked)

    def send_to_host(self, pkt: bytes):
        crc = icrc(self.lo, self.lo, self.port, self.host[1], pkt)
        self.sock.sendto(pkt + crc, self.host)

    def _poll_host(self):
        replies = []
        while True:
            try:
                dg, src = self.sock.recvfrom(2048)
            except BlockingIOError:
                break
            ib, crc = dg[:-4], dg[-4:]
            if icrc(self.lo, self.lo, src[1], self.port, ib) != crc:
                self.icrc_bad += 1
                continue
            assert ib[0] == ACK_OPCODE, f"host sent opcode {ib[0]:#x}"
            self.host_replies.append((ib[12], psn_of(ib)))
            replies.append(ib)
        for ib in self.bridge.on_acks(self, replies):
            self.feed_ack(ib)
        for p in self.bridge.tick(self):
            self.send_to_host(p)

    def feed_ack(self, ib: bytes):
        syn, psn = ib[12], psn_of(ib)
        self.acks_in.append((syn, psn))
        upto = psn if syn >> 5 == 0 else (psn - 1) & 0xFFFFFF  # a NAK acks what is before it
        if syn >> 5 in (0, 1, 3) and (self.last_ack_psn is None
                                      or psn_diff(upto, self.last_ack_psn) > 0):
            self.last_ack_psn = upto
        self.ack_queue.append(ib)

    # -- the clock loop -------------------------------------------------------
    async def run(self):
        d = self.dut
        clk = d.CLK
        rx_valid, rx_data, rx_keep, rx_last = (d.m_data_stream_tvalid, d.m_data_stream_tdata,
                                               d.m_data_stream_tkeep, d.m_data_stream_tlast)
        dma_valid = d.m_dma_read_valid
        wc_valid = d.m_work_comp_sq_valid
        meta_valid = d.m_meta_data_tvalid
        wr_driving = ack_driving = meta_driving = dma_driving = False
        while self.running:
            await RisingEdge(clk)
            self.cycle += 1
            # --- sample handshakes of this edge
            if wr_driving and d.s_work_req_ready.value:
                self.wr_queue.pop(0)
                wr_driving = False
            if ack_driving and d.s_data_stream_tready.value:
                self.ack_queue.pop(0)
                ack_driving = False
            if meta_driving and d.s_meta_data_tready.value:
                self.meta_req = None
                meta_driving = False
            if dma_driving and d.s_dma_read_ready.value:
                self.dma_beats.pop(0)
                dma_driving = False
            if meta_valid.value:
                self.meta_resp = d.m_meta_data_tdata.value.to_unsigned()
            if dma_valid.value:
                self.dma_reqs.append((d.m_dma_read_initiator.value.to_unsigned(),
                                      d.m_dma_read_sqpn.value.to_unsigned(),
                                      d.m_dma_read_wr_id.value.to_unsigned(),
                                      d.m_dma_read_start_addr.value.to_unsigned(),
                                      d.m_dma_read_len.value.to_unsigned()))
            if wc_valid.value:
                self.completions.append((d.m_work_comp_sq_id.value.to_unsigned(),
                                         d.m_work_comp_sq_status.value.to_unsigned(),
                                         self.cycle))
            if rx_valid.value:
                keep = rx_keep.value.to_unsigned()
                n = bin(keep).count("1")
                assert keep == ((1 << n) - 1) << (32 - n), f"tkeep {keep:#x} not left-aligned"
                self.rx_beats += rx_data.value.to_unsigned().to_bytes(32, "big")[:n]
                if rx_last.value:
                    pkt, self.rx_beats = bytes(self.rx_beats), bytearray()
                    self._engine_packet(pkt)
            # --- host side
            if self.cycle % self.POLL == 0:
                self._poll_host()
                if self.on_poll:
                    self.on_poll()
            # --- drive inputs for the next edge
            if not wr_driving:
                self._drive_wr()
                wr_driving = bool(self.wr_queue)
            if not ack_driving:
                if self.ack_queue:
                    ib = self.ack_queue[0]
                    d.s_data_stream_tdata.value = int.from_bytes(ib.ljust(32, b"\0"), "big")
                    d.s_data_stream_tkeep.value = ((1 << len(ib)) - 1) << (32 - len(ib))
                    d.s_data_stream_tfirst.value = 1
                    d.s_data_stream_tlast.value = 1
                    d.s_data_stream_tvalid.value = 1
                    ack_driving = self.ack_valid = True
                elif self.ack_valid:
                    d.s_data_stream_tvalid.value = 0
                    self.ack_valid = False
            if not meta_driving:
                if self.meta_req is not None and self.meta_resp is None:
                    d.s_meta_data_tdata.value = self.meta_req
                    d.s_meta_data_tvalid.value = 1
                    meta_driving = self.meta_valid = True
                elif self.meta_valid:
                    d.s_meta_data_tvalid.value = 0
                    self.meta_valid = False
            if not dma_driving:
                if not self.dma_beats and self.dma_reqs:
                    self.dma_beats = self._dma_beats(self.dma_reqs.pop(0))
                if self.dma_beats:
                    init, sqpn, wr_id, beat = self.dma_beats[0]
                    d.s_dma_read_initiator.value = init
                    d.s_dma_read_sqpn.value = sqpn
                    d.s_dma_read_wr_id.value = wr_id
                    d.s_dma_read_data_stream.value = beat
                    d.s_dma_read_valid.value = 1
                    dma_driving = self.dma_valid = True
                elif self.dma_valid:
                    d.s_dma_read_valid.value = 0
                    self.dma_valid = False

    def start(self, first_psn: int):
        self.first_psn = first_psn
        cocotb.start_soon(self.run())

    def close(self):
        self.running = False
        self.sock.close()
