"""Received frames: loans of receive-slab memory, viewed zero-copy."""
from __future__ import annotations

import ctypes
import functools
import typing
import weakref

from . import _loader
from ._cdecl import (_FRAME_RECORD, FRAME_HAS_IMMEDIATE, FRAME_RX_TIME_KERNEL, FRAME_RX_TIME_NIC,
                     _Batch, _Frame)
from ._loader import _check, _last_error, _lib
from ._errors import Rocev2Error, Status

if typing.TYPE_CHECKING:
    from ._server import Server


class Frame:
    """A received frame on loan. ``data`` is a read-only memoryview into the
    receive slab (zero copy), valid until :meth:`release`. Released on garbage
    collection or context-manager exit if not before.

    A consumer that holds ``data``'s buffer (an export: ``numpy.frombuffer(
    frame.data)``, ``struct.iter_unpack(fmt, frame.data)``, ...) holds the
    slot: while it does, :meth:`release` raises BufferError and keeps the
    loan (release again once the consumer is dropped), and a frame garbage
    collected meanwhile leaves its loan to the export, released when the
    consumer drops it. A held frame is a slot the sender cannot fill: hold
    ``rxQueueDepth`` of them and the link stalls (RNR NAKs) until one is
    released.

    A view *derived* from ``data`` (a slice ``frame.data[8:]``,
    ``memoryview(frame.data)``, ``.cast()``) is another window on the same
    slab memory, not an export: it does not hold the slot, and after release
    it reads whatever the slot receives next (not the frame's bytes). It
    does keep the slab's memory alive: the server's library handle is
    destroyed only when the last view of its slab is gone (after
    :meth:`Server.close` or :meth:`Server.recreate` too), so reading one
    never reads freed memory. Copy (``frame.tobytes()``,
    ``numpy.array(frame.data)``) to keep the bytes.

    Each loan ends exactly once whatever Python raises where (a signal
    handler that raises, Ctrl-C): the token is held by a :class:`_Loan`
    armed on ``data``, and every path that ends the loan takes it and makes
    the library call with no point in between where Python runs a signal
    handler; a loan no path took ends when ``data`` is freed, in C.

    ``rx_time_ns`` is when the frame's last packet was received (host
    CLOCK_REALTIME, nanoseconds since the epoch, comparable with
    ``time.time_ns()``); ``rx_time_source`` says whose stamp: "kernel" (the
    kernel's receive stamp, soft backend), "nic" (the NIC's completion
    timestamp on the host clock: verbs on a device that stamps completions,
    such as mlx5) or "poll" (the host clock when the completion was polled:
    verbs otherwise)."""
    __slots__ = ("_server", "_handle", "_slab", "_loan", "data", "channel", "immediate",
                 "has_immediate", "slot", "address",
                 "rx_time_ns", "rx_time_source")

    _server: Server
    _handle: typing.Optional[int]
    _slab: _SlabView
    _loan: typing.Optional[_Loan]
    data: memoryview
    channel: int
    immediate: int
    has_immediate: bool
    slot: int
    address: int
    rx_time_ns: int
    rx_time_source: str

    def __init__(self, server: Server, f: _Frame, handle: typing.Optional[int], slab: _SlabView,
                 take: bool = True) -> None:
        self._server = server
        # The library handle this loan belongs to (the one polled): it stays
        # valid for its tokens after destroy (and after Server.recreate()).
        self._handle = handle
        self._slab = slab
        self._loan = None
        self.address = f.data
        self.data = slab.view(f.data, f.len)
        self.channel = f.channel
        self.immediate = f.immediate
        # False for a message sent without an immediate (channel and
        # immediate are then 0); a 0-byte message is a frame like any other.
        self.has_immediate = bool(f.flags & FRAME_HAS_IMMEDIATE)
        self.slot = f.slot
        self.rx_time_ns = f.rx_time_ns
        self.rx_time_source = _rx_source(f.flags)
        loan = _Loan(self.data, slab.give_back)
        loan._as_parameter_ = f.token
        # Armed: the loan is this frame's (and kept alive by the slab's
        # table). With ``take`` the struct's token is cleared in the same
        # breath (no signal check between these stores), so a caller's
        # handler gives back exactly the loans no Frame took.
        self._loan = loan
        slab.armed[f.slot] = loan
        if take:
            f.token = 0

    @property
    def ring_position(self) -> int:
        """The FPGA's ring position: immediate bits [31:8]."""
        return int(self.immediate) >> 8

    def __len__(self) -> int:
        return len(self.data) if self._loan is not None else 0

    def tobytes(self) -> bytes:
        """A copy of the payload."""
        return self.data.tobytes()

    def release(self) -> None:
        """Returns the slot to the receiver (idempotent). Raises BufferError,
        and keeps the loan, while a consumer holds an export of ``data``
        (``numpy.frombuffer(frame.data)``, ...): drop it, then release again."""
        if self._loan is None:
            return
        # The view first: it refuses while exported, and the loan must
        # outlive every reader of the slot.
        try:
            self.data.release()
        except BufferError:
            raise BufferError(_HELD_EXPORT) from None
        # Take the loan and end it with nothing between that runs a signal
        # handler (loads and stores, then the C call); another thread's
        # release() may have taken it meanwhile.
        loan, self._loan = self._loan, None
        if loan is not None:
            self._slab.armed[self.slot] = None
            _check(_loader.RELEASE(self._handle, loan))

    def __enter__(self) -> "Frame":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        # Interrupted anywhere here (a signal handler raising), the loan stays
        # armed on ``data`` and ends when the view is freed.
        try:
            if self._loan is None:
                return
            self.data.release()
        except Exception:
            # BufferError: a consumer still holds data's buffer (an export):
            # the loan goes with the view, ended when the consumer drops it.
            # AttributeError: __init__ did not finish.
            return
        loan, self._loan = self._loan, None
        if loan is not None:
            self._slab.armed[self.slot] = None
            _loader.RELEASE(self._handle, loan)

    def __repr__(self) -> str:
        return (f"Frame(channel={self.channel}, len={len(self)}, "
                f"ring_position={self.ring_position}, slot={self.slot})")


def _rx_source(flags: int) -> str:
    """rocev2_frame.flags' receive-time source: "kernel", "nic" or "poll"."""
    if flags & FRAME_RX_TIME_KERNEL:
        return "kernel"
    return "nic" if flags & FRAME_RX_TIME_NIC else "poll"


if typing.TYPE_CHECKING:
    _WeakView = weakref.ref[memoryview]
else:
    _WeakView = weakref.ref


class _Loan(_WeakView):
    """A frame's loan: a weak reference to its ``data`` view whose callback
    (``functools.partial`` of the library's release, with the handle), run
    when the view is freed while the loan is still armed, ends the loan in C
    alone: the token is this object's ``_as_parameter_``, which ctypes
    passes, so no Python code runs there that a signal could interrupt.
    Armed, it is kept alive by its slab's table (``_SlabView.armed``, by
    slot), not by the frame alone: a frame freed first (its __del__ cut
    short, or ``data`` exported) leaves it armed for ``data``. Every other
    path disarms it (drops it from the frame and the table) in the same
    breath as its own release call."""
    __slots__ = ("_as_parameter_",)
    _as_parameter_: int


def arm_batch(server: Server, b: _Batch, slab: _SlabView, n: int, frames: typing.List[Frame]) -> None:
    """Appends to ``frames`` the frames of the first ``n`` rocev2_frame
    records of ``b`` (poll_frames' batch), each ``data`` a slice of the slab's
    view. ``b.armed`` counts the records whose loan a Frame took (the
    caller's handler gives back the rest): arming, counting and appending
    have no signal check between them."""
    # ``loan`` first among the locals: should a signal's exception end this
    # function between making a loan and arming it, it is cleared before the
    # frame (its view) dies, so its callback never runs unarmed.
    loan = None
    new, loan_of, give, handle = Frame.__new__, _Loan, slab.give_back, slab.handle
    whole, base, size, armed = slab.whole, slab.base, slab.size, slab.armed
    append = frames.append
    records = _FRAME_RECORD.iter_unpack(b.raw[:n * _FRAME_RECORD.size])
    for _, flags, address, length, channel, immediate, slot, token, rx_time_ns in records:
        f = new(Frame)
        f._server = server
        f._handle = handle
        f._slab = slab
        f._loan = None
        f.address = address
        off = address - base
        # (slab.view inlined: a Python call per frame costs more than the rest)
        f.data = whole[off:off + length] if 0 <= off <= size - length else slab.view(address, length)
        f.channel = channel
        f.immediate = immediate
        f.has_immediate = flags & FRAME_HAS_IMMEDIATE != 0
        f.slot = slot
        f.rx_time_ns = rx_time_ns
        f.rx_time_source = _rx_source(flags)
        loan = loan_of(f.data, give)
        loan._as_parameter_ = token
        f._loan = loan
        armed[slot] = loan
        b.armed += 1
        append(f)
        loan = None


class _SlabView:
    """One read-only memoryview of a server's receive slab (``mr_addr``,
    ``mr_len``: every frame lies in it), so a frame's ``data`` is a slice of
    it (one object). Every view of the slab, slices included, keeps its
    exporter (a ctypes array over the slab) alive; ``memory`` is a weak
    reference to it: the server's handle is destroyed only once it is gone
    (see ``_server._reap``). ``give_back``: the library's release bound to
    the handle, the callback of every :class:`_Loan` of this server;
    ``armed``: the armed loans by slot (one at a time per slot), which keeps
    each alive until it is disarmed or its slot lent again."""
    __slots__ = ("handle", "base", "size", "whole", "memory", "give_back", "armed")

    def __init__(self, handle: typing.Optional[int], mr_addr: int, mr_len: int) -> None:
        self.handle, self.base, self.size = handle, mr_addr, mr_len
        exporter = _slab_type(mr_len).from_address(mr_addr)
        self.memory = weakref.ref(exporter)
        self.whole = memoryview(exporter).cast("B").toreadonly()
        self.give_back = functools.partial(_loader.RELEASE, handle)
        self.armed: typing.Dict[int, typing.Optional[_Loan]] = {}

    def view(self, address: int, length: int) -> memoryview:
        """``length`` bytes at ``address``, a slice of the slab's view."""
        off = address - self.base
        if not 0 <= off <= self.size - length:
            raise Rocev2Error(Status.INTERNAL, f"frame at {address:#x} ({length} bytes) lies outside "
                              f"the slab ({self.base:#x}, {self.size} bytes)")
        return self.whole[off:off + length]


_slab_types: typing.Dict[int, typing.Any] = {}


def _slab_type(size: int) -> typing.Any:
    """A ctypes array type of ``size`` bytes that takes weak references (a
    subclass: the plain array types do not)."""
    t = _slab_types.get(size)
    if t is None:
        t = _slab_types[size] = type("_SlabMemory", (ctypes.c_uint8 * size,), {})
    return t


_HELD_EXPORT = ("frame.data is held by a consumer (an export of its buffer, e.g. "
                "numpy.frombuffer(frame.data)): the frame stays on loan, its slot unavailable "
                "to the sender. Drop the consumer, then release again (or copy the bytes: "
                "frame.tobytes())")


def pattern_check(data: typing.Union[Frame, bytes, bytearray, memoryview]) -> int:
    """Checks a frame of the FPGA emulator's pattern (bytes 0..8: sequence
    number, little-endian; then xorshift32 seeded from it) with the library's
    check; returns the sequence number or raises ValueError. ``data``: a
    :class:`Frame` (checked in place, no copy) or any bytes-like object."""
    seq = ctypes.c_uint64(0)
    if isinstance(data, Frame):
        st = _lib().rocev2_pattern_check(data.address, len(data), ctypes.byref(seq))
    else:
        b = bytes(data)
        st = _lib().rocev2_pattern_check(b, len(b), ctypes.byref(seq))
    if st != Status.OK:
        raise ValueError(_last_error())
    return int(seq.value)
