"""The receive server, its handles' lifecycle and per-channel views."""
from __future__ import annotations

import atexit
import ctypes
import math
import sys
import threading
import time
import typing
import weakref

from . import _loader
from ._cdecl import (_FRAME_CB, _FRAME_RECORD, _RECORD_WORDS, _STAT_FIELDS, _TOKEN_WORD, _STAT_FIELDS_2_1, _STAT_FIELDS_2_2,
                     _STAT_FIELDS_2_3, _STAT_FIELDS_2_3_PEER, _STAT_FIELDS_2_4,
                     _STRUCT_SIZE, _Batch, _Frame, _HostParams, _Stats)
from ._codes import LinkState, Mtu, _u32, validate_channel
from ._channels import ChannelView, _Demux
from ._config import HostParams, ServerCfg, TransportCfg
from ._errors import Rocev2Error, Status
from ._frames import _HELD_EXPORT, Frame, _SlabView, arm_batch
from ._gid import ip_to_gid_bytes, parse_gid, host_ip_from_gid
from ._loader import _answered, _check, _lib, _raw


# The longest library wait: a wait for a frame is made of waits of at most
# this, so that Python runs its signal handlers (Ctrl-C: KeyboardInterrupt)
# in between. A frame that is there returns at once, whatever the slice.
_SLICE_MS = 100


def _first_wait(timeout: typing.Optional[float]) -> typing.Tuple[int, typing.Optional[float]]:
    """A wait of ``timeout`` seconds (None: forever) in slices: the first
    slice's milliseconds and the deadline for :func:`_next_wait`
    (time.monotonic(); math.inf: none; None: the first slice is all)."""
    if timeout is None:
        return _SLICE_MS, math.inf
    ms = max(0, int(timeout * 1000))
    if ms <= _SLICE_MS:
        return ms, None
    return _SLICE_MS, time.monotonic() + timeout


def _next_wait(deadline: typing.Optional[float]) -> typing.Optional[int]:
    """The next slice's milliseconds before ``deadline``, None once it passed."""
    if deadline is None:
        return None
    if deadline == math.inf:
        return _SLICE_MS
    left = deadline - time.monotonic()
    return None if left <= 0 else min(_SLICE_MS, math.ceil(left * 1000))


class _Handles:
    """A server's library handles and the frame callback the library calls,
    apart from the :class:`Server` so that its finalizer (weakref.finalize:
    it must not refer to the server) closes them when the server is garbage
    collected. ``srv`` and ``dev`` are the server's own c_void_p objects:
    closing zeroes them in place, so the server sees itself closed.
    ``rx_thread``: the receive thread, once a frame callback ran on it.
    ``slab``: the view of the server's slab its frames' ``data`` slice (None
    once closed); ``memory``: a weak reference to that view's exporter,
    alive while any view of the slab is (the handle is destroyed only after)."""
    __slots__ = ("srv", "dev", "cb", "rx_thread", "slab", "memory")
    cb: typing.Any  # the frame callback's C function pointer
    rx_thread: typing.Optional[int]
    slab: typing.Optional[_SlabView]
    memory: typing.Optional[typing.Callable[[], typing.Any]]

    def __init__(self, srv: ctypes.c_void_p, dev: ctypes.c_void_p):
        self.srv, self.dev, self.cb, self.rx_thread = srv, dev, None, None
        self.slab = self.memory = None
        _live.add(self)

    def attach_slab(self, mr_addr: int, mr_len: int) -> None:
        """The slab's view, made once the server exists. Its exporter's end
        (the last view of the slab gone) lets a closed server be destroyed."""
        slab = _SlabView(self.srv.value, mr_addr, mr_len)
        exporter = slab.memory()
        self.memory = weakref.ref(exporter, _slab_freed)
        self.slab = slab

    def stop(self) -> None:
        if self.srv:
            _lib().rocev2_server_stop(self.srv)

    def close(self) -> None:
        """Stops the server now (its thread and socket) and destroys it and
        closes the device once nothing needs them (once: the finalizer calls
        it): not on the server's own receive thread (its frame callback closed
        it, or dropped the last reference: the library's destroy must not run
        there; the thread ends when the callback returns), and not while a
        view of its slab lives (a frame's ``data``, a slice of it: destroy
        would free the memory it reads). :func:`_reap` does it then."""
        _live.discard(self)
        srv, dev, cb = self.srv.value, self.dev.value, self.cb
        self.srv.value = self.dev.value = self.cb = None
        self.slab = None
        if srv:
            _lib().rocev2_server_stop(srv)
        _deferred.append((srv, dev, cb, self.rx_thread, self.memory))
        _reap()


# Servers not yet closed (their handles), for the exit hook.
_live: typing.Set[_Handles] = set()
# Closed (stopped), destroyed by _reap once neither their receive thread nor
# a view of their slab needs them: (server, device, frame callback kept alive
# until then, receive thread, weak reference to the slab's exporter).
_deferred: typing.List[typing.Tuple[typing.Optional[int], typing.Optional[int], typing.Any,
                                    typing.Optional[int], typing.Any]] = []


def _destroy(srv: typing.Optional[int], dev: typing.Optional[int]) -> None:
    if srv:
        _lib().rocev2_server_destroy(srv)
    if dev:
        _lib().rocev2_device_close(dev)


def _reap() -> None:
    """Destroys the closed servers nothing needs any more: not one whose
    receive thread this is, nor one a view of whose slab lives."""
    me = threading.get_ident()
    for _ in range(len(_deferred)):
        try:
            entry = _deferred.pop(0)
        except IndexError:
            return
        if entry[3] == me or (entry[4] is not None and entry[4]() is not None):
            _deferred.append(entry)
        else:
            _destroy(entry[0], entry[1])


def _slab_freed(_memory: typing.Any) -> None:
    """The last view of a slab is gone: its closed server can go."""
    try:
        _reap()
    except Exception:
        pass  # a weak reference's callback: the next close or create reaps


@atexit.register
def _stop_all_at_exit() -> None:
    """At interpreter exit, before it finalizes: stops every live server,
    joining its receive thread, so no library thread calls into Python while
    the interpreter finalizes (a frame callback entering then would end its
    thread mid-call and abort the process). Stop, not destroy: a daemon
    thread may still be inside a poll call; the process's end frees the rest."""
    for h in list(_live):
        try:
            h.stop()
        except Exception:
            pass


class Server:
    """The RoCEv2 receive server (rogue ``rogue.protocols.rocev2.Server``).

    ``Server(ServerCfg(...))`` opens the device (rogue's Core), creates the
    server (QP in INIT) and sets the FPGA GID from ``cfg.ip``. Then
    :meth:`get_host_params` (program the FPGA), optionally
    :meth:`set_frame_callback`, :meth:`complete_connection`, and frames.

    Close it with :meth:`close` (or ``with``); a server garbage collected
    unclosed is closed then (its thread, sockets, port and memory freed), and
    every live server is stopped at interpreter exit.
    """

    def __init__(self, cfg: ServerCfg):
        self._cfg = cfg
        self._cb_fn: typing.Optional[typing.Callable[[Frame], None]] = None
        self._start()

    def _start(self) -> None:
        """Opens the device and creates the server (fresh handles, channel
        demultiplexer and kept arrays): what __init__ and recreate() do."""
        cfg = self._cfg
        self._dev = ctypes.c_void_p()
        self._srv = ctypes.c_void_p()
        self._h = _Handles(self._srv, self._dev)
        # close() or garbage collection; not at exit (_stop_all_at_exit stops).
        self._closer = weakref.finalize(self, self._h.close)
        self._closer.atexit = False
        _reap()
        # Frames poll(channel=...) took for other channels (see _channels.py).
        self._demux = _Demux(typing.cast(int, cfg.rxQueueDepth) // 2)  # an int after ServerCfg.__post_init__
        # Kept for poll_frames / release_frames: rocev2_frame arrays (with
        # their bytes) and token arrays, taken and put back (list.pop and
        # append are atomic: threads polling at once each get their own),
        # and the slab's view (per library handle).
        self._batches: typing.List[_Batch] = []
        self._token_arrays: typing.List[ctypes.Array[ctypes.c_uint64]] = []
        self.gidIndex = cfg._gid_index()
        dc = cfg._c_device_config(self.gidIndex)
        _check(_lib().rocev2_device_open(ctypes.byref(dc), ctypes.byref(self._dev)))
        try:
            sc = cfg._c_config()
            _check(_lib().rocev2_server_create(self._dev, ctypes.byref(sc), ctypes.byref(self._srv)))
            self.setFpgaGid(ip_to_gid_bytes(cfg.ip))
            hp = self._hp()
            self._h.attach_slab(hp.mr_addr, hp.mr_len)
        except BaseException:
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------
    def _handle(self) -> ctypes.c_void_p:
        if not self._srv:
            raise Rocev2Error(Status.STOPPED, "server is closed")
        return self._srv

    def setFpgaGid(self, gid: typing.Union[bytes, str]) -> None:
        """FPGA GID: 16 bytes, or text (IPv4 / GID string)."""
        raw = parse_gid(gid) if isinstance(gid, str) else bytes(gid)
        if len(raw) != 16:
            raise Rocev2Error(Status.INVALID_ARGUMENT, f"GID must be 16 bytes, got {len(raw)}")
        _check(_lib().rocev2_server_set_fpga_gid(self._handle(), raw))

    set_fpga_gid = setFpgaGid

    def set_frame_callback(self, fn: typing.Callable[[Frame], None]) -> None:
        """Calls ``fn(frame)`` on the receive thread for every frame (before
        complete_connection). The frame is released when ``fn`` drops it."""
        # The library holds the trampoline until the server is destroyed: it
        # refers to the server weakly (and finds fn on it), so that the
        # server can be garbage collected (and closed) meanwhile.
        server, h, handle = weakref.ref(self), self._h, self._handle().value
        is_finalizing = sys.is_finalizing

        def trampoline(_user: typing.Optional[int], fp: typing.Any) -> None:
            if is_finalizing():
                return  # no Python code while the interpreter finalizes
            if h.rx_thread is None:
                h.rx_thread = threading.get_ident()
            srv = server()
            on_frame = srv._cb_fn if srv is not None else None
            slab = h.slab
            if srv is None or on_frame is None or slab is None:  # collected or closed: give it back
                _lib().rocev2_server_release(handle, fp.contents.token)
                return
            # The library's struct is not ours to clear (take=False): on the
            # receive thread no signal handler runs between here and arming.
            on_frame(Frame(srv, fp.contents, handle, slab, take=False))
        cb = _FRAME_CB(trampoline)
        _check(_lib().rocev2_server_register_frame_callback(self._handle(), cb, None))
        h.cb = cb  # keep the C function pointer alive until the server is destroyed
        self._cb_fn = fn

    def completeConnection(self, fpgaQpn: int, fpgaRqPsn: typing.Optional[int] = None,
                           pmtu: int = Mtu.MTU_4096, minRnrTimer: int = 12) -> None:
        """INIT->RTR->RTS and start receiving. ``fpgaRqPsn`` defaults to the
        host SQ PSN (surf programs the FPGA's send PSN with it)."""
        pmtu, minRnrTimer = _u32(pmtu, "pmtu"), _u32(minRnrTimer, "minRnrTimer")
        if fpgaRqPsn is None:
            fpgaRqPsn = self.getSqPsn()
        _check(_lib().rocev2_server_complete_connection(self._handle(), fpgaQpn, fpgaRqPsn,
                                                         int(pmtu), int(minRnrTimer)))

    def complete_connection(self, fpga_qpn: int, fpga_rq_psn: typing.Optional[int] = None,
                            transport: typing.Optional[TransportCfg] = None) -> None:
        """snake_case form taking a :class:`TransportCfg` (default: pmtu 4096, RNR 0.64 ms)."""
        t = transport or TransportCfg()
        self.completeConnection(fpga_qpn, fpga_rq_psn, t.pmtu, t.minRnrTimer)

    def stop(self) -> None:
        """Stops receiving (idempotent); loaned frames stay valid until released."""
        if self._srv:
            _check(_lib().rocev2_server_stop(self._srv))

    def recreate(self) -> HostParams:
        """The remedy after an FPGA reload when the server cannot follow it
        (the verbs backend: the NIC ACKs the restarted stream as old
        duplicates, see docs/operations.md), or after the link went to the
        error state: destroys this server and creates a new one with the same
        configuration (a new QP with new PSNs, a new slab; the frame callback
        registered again if one was set) and the same FPGA GID. Returns the
        new host params: program the FPGA with them, then call
        :meth:`complete_connection`. Frames still on loan from the old
        server stay valid until released."""
        fn = self._cb_fn
        self.close()
        self._cb_fn = None
        self._start()
        if fn is not None:
            self.set_frame_callback(fn)
        return self.get_host_params()

    def close(self) -> None:
        """Stops and frees the server and device handles (idempotent; done on
        garbage collection if not before). Frames still on loan stay valid
        and release through the retired handle (the library keeps its memory
        until the last one is released)."""
        self._closer()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames ------------------------------------------------------------
    def _slab_of(self, handle: typing.Optional[int]) -> _SlabView:
        """The slab view of library handle ``handle``: STOPPED once the server
        was closed (or recreated) since ``handle`` was read."""
        slab = self._h.slab
        if slab is None or slab.handle != handle:
            raise Rocev2Error(Status.STOPPED, "server is closed")
        return slab

    def _poll_raw(self, timeout: typing.Optional[float]) -> typing.Optional[Frame]:
        """One frame in slices of a wait (see :data:`_SLICE_MS`)."""
        f = _Frame()
        f.struct_size = ctypes.sizeof(f)
        f.token = 0
        ms: typing.Optional[int]
        ms, deadline = _first_wait(timeout)
        poll, ref = _lib().rocev2_server_poll_frame, ctypes.byref(f)
        give_back = _loader.RELEASE
        handle: typing.Optional[int] = 0
        try:
            while True:
                handle = self._handle().value  # closed meanwhile: Rocev2Error (STOPPED)
                st = poll(handle, ms, ref)
                if st != Status.TIMEOUT:
                    break
                ms = _next_wait(deadline)
                if ms is None:
                    return None
            _check(st)
            _answered(f, "rocev2_server_poll_frame")
            return Frame(self, f, handle, self._slab_of(handle))
        except BaseException:
            # Interrupted (a signal handler raising, Ctrl-C) or failed after
            # the library lent a frame that no Frame took (a Frame clears
            # f.token as it takes the loan): give it back, in one C call
            # reached with no signal check on the way.
            if f.token:
                give_back(handle, f.token)
            raise

    def poll_frames(self, max_frames: int = 64,
                    timeout: typing.Optional[float] = None) -> typing.List[Frame]:
        """Up to ``max_frames`` frames in one library call: waits up to
        ``timeout`` seconds (None: forever) for the first, then takes those
        already queued. [] on timeout; Rocev2Error (STOPPED) once stopped.
        Release them with :meth:`release_frames` (one call) or each
        ``frame.release()``. The fast path from Python (no channel filter);
        threads may poll one server at once (each gets frames of its own).
        Ctrl-C interrupts the wait (see :data:`_SLICE_MS`)."""
        if max_frames < 1:
            raise Rocev2Error(Status.INVALID_ARGUMENT, f"max_frames must be >= 1; got {max_frames}")
        handle = self._handle()
        try:
            b = self._batches.pop()
        except IndexError:
            b = None
        if b is None or len(b.frames) < max_frames:
            b = _Batch(max(max_frames, 64))
        size = _FRAME_RECORD.size
        frames: typing.List[Frame] = []
        b.got.value = 0
        b.armed = 0
        hv = handle.value
        give_back = _loader.RELEASE_MANY
        words, tokens, token_words = b.words, b.tokens, b.token_words
        try:
            _STRUCT_SIZE.pack_into(b.raw, 0, size)
            ms: typing.Optional[int]
            ms, deadline = _first_wait(timeout)
            poll, cap = _raw("rocev2_server_poll_frames"), ctypes.c_size_t(max_frames)
            while True:  # in slices of the wait (see _SLICE_MS)
                hv = handle.value
                st = poll(handle, ctypes.c_int32(ms), b.frames, cap, b.got_ref)
                if st != Status.TIMEOUT:
                    break
                ms = _next_wait(deadline)
                if ms is None:
                    return frames
                handle = self._handle()  # closed meanwhile: Rocev2Error (STOPPED)
            if st:
                _check(st)
            if _STRUCT_SIZE.unpack_from(b.raw)[0] != size:
                _answered(b.frames[0], "rocev2_server_poll_frames")
            arm_batch(self, b, self._slab_of(hv), b.got.value, frames)
            return frames
        except BaseException:
            # Interrupted (a signal handler raising, Ctrl-C) or failed after
            # the library lent frames: give back those no Frame took (records
            # b.armed.. of b.got; the Frames made release theirs when
            # dropped), gathered by one strided copy and given in one C call,
            # with no signal check on the way.
            token_words[:b.got.value - b.armed] = words[_TOKEN_WORD + _RECORD_WORDS * b.armed:
                                                         _RECORD_WORDS * b.got.value:_RECORD_WORDS]
            give_back(hv, tokens, b.got.value - b.armed)
            b.got.value = 0
            raise
        finally:
            self._batches.append(b)

    def release_frames(self, frames: typing.Iterable[Frame]) -> None:
        """Releases many frames in one library call (each once; already
        released ones are skipped). A frame whose ``data`` a consumer holds
        (see :class:`Frame`) stays on loan: the others are released, then
        BufferError says how many were kept."""
        mine: typing.Dict[typing.Optional[int], typing.List[Frame]] = {}  # by library handle
        held = seen = 0
        for f in frames:
            seen += 1
            if f._loan is not None:
                try:
                    f.data.release()
                except BufferError:
                    held += 1
                    continue
                mine.setdefault(f._handle, []).append(f)
        for h, group in mine.items():
            self._release_many(h, group)
        if held:
            raise BufferError(f"{held} of {seen} frames kept: " + _HELD_EXPORT)

    def _release_many(self, handle: typing.Optional[int], frames: typing.List[Frame]) -> None:
        """One rocev2_server_release_many through a kept token array. Each
        frame's loan moves to the array (taken from the frame, stored, counted,
        with no signal check between), so a signal's exception anywhere leaves
        each loan either with its frame or in the array's first ``n``, which
        the handler gives back in one C call."""
        try:
            arr = self._token_arrays.pop()
        except IndexError:
            arr = None
        if arr is None or len(arr) < len(frames):
            arr = (ctypes.c_uint64 * max(len(frames), 64))()
        give_back = _loader.RELEASE_MANY
        n = 0
        try:
            for f in frames:
                loan, f._loan = f._loan, None
                if loan is not None:
                    f._slab.armed[f.slot] = None
                    arr[n] = loan._as_parameter_
                    n += 1
                    loan = None  # disarmed: the loan is the array's
        except BaseException:
            give_back(handle, arr, n)
            raise
        st = give_back(handle, arr, n)
        self._token_arrays.append(arr)
        _check(st)

    def poll(self, timeout: typing.Optional[float] = None,
             channel: typing.Optional[int] = None) -> typing.Optional[Frame]:
        """The next frame (optionally of one channel), or None after ``timeout``
        seconds (None waits forever; Ctrl-C interrupts the wait). Raises
        Rocev2Error (STOPPED) once stopped. Frames of other channels that a
        ``channel`` poll takes are kept for their readers (a poll of theirs,
        or a plain poll: the oldest kept first), at most ``rxQueueDepth // 2``:
        beyond that the oldest is released unread (:attr:`channel_drops`)."""
        if channel is None:
            kept = self._demux.take_oldest()  # frames kept by poll(channel=...): the oldest first
            return kept if kept is not None else self._poll_raw(timeout)
        validate_channel(channel)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            kept = self._demux.take(channel)
            if kept is not None:
                return kept
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            f = self._poll_raw(left)
            if f is None:
                return None
            if f.channel == channel:
                return f
            self._demux.keep(f, channel)

    @property
    def channel_drops(self) -> int:
        """Frames that poll(channel=...) or a :class:`ChannelView` took for
        other channels and released unread, the oldest beyond the
        ``rxQueueDepth // 2`` kept for those channels' readers."""
        return self._demux.drops

    def frames(self, timeout: typing.Optional[float] = None,
               channel: typing.Optional[int] = None) -> typing.Iterator[Frame]:
        """Iterates frames until the server stops (or ``timeout`` passes with none)."""
        while True:
            try:
                f = self.poll(timeout, channel)
            except Rocev2Error as e:
                if e.status == Status.STOPPED:
                    return
                raise
            if f is None:
                return
            yield f

    def __iter__(self) -> typing.Iterator[Frame]:
        return self.frames()

    def channel(self, channel: int) -> "ChannelView":
        """A view of one channel (immediate bits [7:0]), 0..255."""
        return ChannelView(self, validate_channel(channel))

    getChannel = channel

    # -- getters (rogue names) ---------------------------------------------
    def _hp(self) -> _HostParams:
        hp = _HostParams()
        hp.struct_size = ctypes.sizeof(hp)
        _check(_lib().rocev2_server_get_host_params(self._handle(), ctypes.byref(hp)))
        _answered(hp, "rocev2_server_get_host_params")
        return hp

    def getQpn(self) -> int:
        return int(self._hp().qpn)

    def getGid(self) -> str:
        return typing.cast(bytes, self._hp().gid_str).decode()

    def getRqPsn(self) -> int:
        return int(self._hp().rq_psn)

    def getSqPsn(self) -> int:
        return int(self._hp().sq_psn)

    def getMrAddr(self) -> int:
        return int(self._hp().mr_addr)

    def getMrRkey(self) -> int:
        return int(self._hp().mr_rkey)

    def maxPayload(self) -> int:
        return typing.cast(int, self._cfg.maxPayload)  # an int after ServerCfg.__post_init__

    def getFrameCount(self) -> int:
        return self.stats()["frames"]

    def getByteCount(self) -> int:
        return self.stats()["bytes"]

    qpn = property(getQpn)
    gid = property(getGid)
    rq_psn = property(getRqPsn)
    sq_psn = property(getSqPsn)
    mr_addr = property(getMrAddr)
    mr_rkey = property(getMrRkey)
    frame_count = property(getFrameCount)
    byte_count = property(getByteCount)

    @property
    def udp_port(self) -> int:
        """The UDP port the host receives on (4791; the bound port on soft)."""
        return int(self._hp().udp_port)

    @property
    def host_ip(self) -> str:
        return host_ip_from_gid(self.getGid())

    def get_host_params(self) -> HostParams:
        """The five values the FPGA engine's setupConnection() takes."""
        hp = self._hp()  # the library checked the MR length at create
        return HostParams(hp.qpn, hp.rq_psn, hp.sq_psn, hp.mr_addr, hp.mr_len)

    getHostParams = get_host_params

    def stats(self) -> typing.Dict[str, int]:
        """All counters by name."""
        s = _Stats()
        s.struct_size = ctypes.sizeof(_Stats)
        _check(_lib().rocev2_server_get_stats(self._handle(), ctypes.byref(s)))
        _answered(s, "rocev2_server_get_stats")
        return {n: getattr(s, n) for n in _STAT_FIELDS + ["link_state"] + _STAT_FIELDS_2_1
                + _STAT_FIELDS_2_2 + _STAT_FIELDS_2_3_PEER + _STAT_FIELDS_2_3 + _STAT_FIELDS_2_4}

    def end_cause(self) -> typing.Optional[str]:
        """Why the link is down (the receive thread's end cause, "stopped"
        after stop(), or why complete_connection failed); None while it is
        created or connected."""
        n = _lib().rocev2_server_end_cause(self._handle(), None, 0)
        if n == 0:
            return None
        buf = ctypes.create_string_buffer(n + 1)
        _lib().rocev2_server_end_cause(self._handle(), buf, n + 1)
        return buf.value.decode("utf-8", "replace")

    def health(self) -> typing.Dict[str, typing.Any]:
        """Link health for an operator: ``state`` (a :class:`LinkState`),
        ``since_last_packet_s`` / ``since_last_frame_s`` (seconds, None
        before the first), ``end_cause`` (see :meth:`end_cause`),
        ``peer_restarts``, ``stale_peer`` (a stale-peer verdict holds, verbs),
        ``lost_frames_estimate`` (frames lost to restarts, verbs),
        ``duplicating_peer`` (the FPGA sends every message twice: toggle its
        TxEn) and ``rnr_storm`` (RNR NAKs above 100/s); docs/operations.md
        lists every verdict."""
        st = self.stats()

        def seconds(us: int) -> typing.Optional[float]:
            return None if us == 0xFFFFFFFFFFFFFFFF else us / 1e6
        return {"state": LinkState(st["link_state"]),
                "since_last_packet_s": seconds(st["us_since_last_packet"]),
                "since_last_frame_s": seconds(st["us_since_last_frame"]),
                "end_cause": self.end_cause(), "peer_restarts": st["peer_restarts"],
                "stale_peer": bool(st["peer_stale"]),
                "lost_frames_estimate": st["lost_frames_estimate"],
                "duplicating_peer": bool(st["duplicating_peer"]),
                "rnr_storm": bool(st["rnr_storm"])}

    def is_running(self) -> bool:
        return bool(self._srv) and _lib().rocev2_server_is_running(self._srv) != 0

    def conn_info(self) -> str:
        """The RC connection summary (QP/GID/MR and buffer sizing)."""
        hp = self._hp()
        c = self._cfg
        return (f"--- RoCEv2 connection info ---\n"
                f"  Device          : {c.deviceName} port={c.ibPort} GID idx={self.gidIndex}\n"
                f"  Host QPN        : {hex(hp.qpn)}\n"
                f"  Host GID        : {hp.gid_str.decode()}\n"
                f"  Host RQ/SQ PSN  : {hex(hp.rq_psn)} / {hex(hp.sq_psn)}\n"
                f"  MR addr         : {hex(hp.mr_addr)}\n"
                f"  MR rkey         : {hex(hp.mr_rkey)}\n"
                f"  FPGA IP         : {c.ip}\n"
                f"  MaxPayload      : {c.maxPayload}\n"
                f"  RxQueueDepth    : {c.rxQueueDepth}\n"
                f"  MrLen           : {typing.cast(int, c.maxPayload) * typing.cast(int, c.rxQueueDepth)}\n"
                f"------------------------------")

    def printConnInfo(self) -> None:
        print(self.conn_info())

    print_conn_info = printConnInfo
