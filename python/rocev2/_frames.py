"""Received frames: loans of receive-slab memory, viewed zero-copy."""
from __future__ import annotations

import ctypes
import typing
import weakref

from ._cdecl import FRAME_HAS_IMMEDIATE, FRAME_RX_TIME_KERNEL, _Frame
from ._loader import _check, _last_error, _lib
from ._errors import Status

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
    released. Views *derived* from ``data`` (``memoryview(frame.data)``, a
    slice, ``.cast()``) share its memory but are not exports: they do not
    hold the slot, and after release they read whatever the slot receives
    next. Copy (``frame.tobytes()``, ``numpy.array(frame.data)``) to keep
    the bytes.

    ``rx_time_ns`` is when the frame's last packet was received (host
    CLOCK_REALTIME, nanoseconds since the epoch, comparable with
    ``time.time_ns()``); ``rx_time_source`` says whose stamp: "kernel" (the
    kernel's receive stamp, soft backend) or "poll" (the host clock when the
    completion was polled, verbs)."""
    __slots__ = ("_server", "_handle", "_token", "data", "channel", "immediate", "has_immediate", "slot",
                 "address", "rx_time_ns", "rx_time_source")

    _server: Server
    _handle: typing.Optional[int]
    _token: int
    data: memoryview
    channel: int
    immediate: int
    has_immediate: bool
    slot: int
    address: int
    rx_time_ns: int
    rx_time_source: str

    def __init__(self, server: Server, f: _Frame, handle: typing.Optional[int] = None) -> None:
        self._server = server
        # The library handle this loan belongs to (the one polled): it stays
        # valid for its tokens after destroy (and after Server.recreate()).
        self._handle = server._srv.value if handle is None else handle
        self.address = f.data
        buf = (ctypes.c_uint8 * f.len).from_address(f.data)
        self.data = memoryview(buf).cast("B").toreadonly()
        self.channel = f.channel
        self.immediate = f.immediate
        # False for a message sent without an immediate (channel and
        # immediate are then 0); a 0-byte message is a frame like any other.
        self.has_immediate = bool(f.flags & FRAME_HAS_IMMEDIATE)
        self.slot = f.slot
        self.rx_time_ns = f.rx_time_ns
        self.rx_time_source = _rx_source(f.flags)
        self._token = f.token  # last: a frame interrupted before it owns no loan

    @property
    def ring_position(self) -> int:
        """The FPGA's ring position: immediate bits [31:8]."""
        return int(self.immediate) >> 8

    def __len__(self) -> int:
        return len(self.data) if self._token else 0

    def tobytes(self) -> bytes:
        """A copy of the payload."""
        return self.data.tobytes()

    def release(self) -> None:
        """Returns the slot to the receiver (idempotent). Raises BufferError,
        and keeps the loan, while a consumer holds an export of ``data``
        (``numpy.frombuffer(frame.data)``, ...): drop it, then release again."""
        if self._token:
            # The view first: it refuses while exported, and the loan (the
            # token) must outlive every reader of the slot.
            try:
                self.data.release()
            except BufferError:
                raise BufferError(_HELD_EXPORT) from None
            token, self._token = self._token, 0
            if token:  # another thread's release() may have taken it meanwhile
                _check(_lib().rocev2_server_release(self._handle, token))

    def __enter__(self) -> "Frame":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            token = self._token
            if not token:
                return
            try:
                self.data.release()
            except BufferError:
                # A consumer still holds data's buffer (and so the view):
                # the loan goes with the view, released when it is freed.
                _release_with(self.data, self._handle, token)
            else:
                _lib().rocev2_server_release(self._handle, token)
            self._token = 0
        except Exception:
            pass  # __init__ did not finish, or the interpreter is exiting

    @classmethod
    def _batch(cls, server: Server, handle: typing.Optional[int], slab: _SlabView,
               records: typing.Iterable[typing.Tuple[int, ...]], frames: typing.List[Frame]) -> typing.List[Frame]:
        """Appends to ``frames`` (and returns it) the frames of unpacked
        rocev2_frame records (:data:`_FRAME_RECORD`): as ``Frame(server, f)``
        each, with ``data`` a slice of the slab's view."""
        new, base, size, whole = cls.__new__, slab.base, slab.size, slab.whole
        append = frames.append
        for _, flags, address, length, channel, immediate, slot, token, rx_time_ns in records:
            f = new(cls)
            f._server = server
            f._handle = handle
            f.address = address
            off = address - base
            f.data = whole[off:off + length] if 0 <= off <= size - length else _view(address, length)
            f.channel = channel
            f.immediate = immediate
            f.has_immediate = flags & FRAME_HAS_IMMEDIATE != 0
            f.slot = slot
            f.rx_time_ns = rx_time_ns
            f.rx_time_source = "kernel" if flags & FRAME_RX_TIME_KERNEL else "poll"
            # The loan, then into the list: nothing Python checks for a
            # signal at runs between, so each loan is the list's or a record's.
            f._token = token
            append(f)
        return frames

    def __repr__(self) -> str:
        return (f"Frame(channel={self.channel}, len={len(self)}, "
                f"ring_position={self.ring_position}, slot={self.slot})")


def _rx_source(flags: int) -> str:
    """rocev2_frame.flags' receive-time source: "kernel" or "poll"."""
    return "kernel" if flags & FRAME_RX_TIME_KERNEL else "poll"


class _SlabView:
    """One read-only memoryview of a server's receive slab (``mr_addr``,
    ``mr_len``: every frame lies in it), so a frame's ``data`` is a slice of it
    (one object) instead of a ctypes array, a memoryview and two views of it
    per frame. The slab outlives every loan (the library keeps it until the
    last token is released), and a slice keeps nothing alive."""
    __slots__ = ("handle", "base", "size", "whole")

    def __init__(self, handle: typing.Optional[int], mr_addr: int, mr_len: int) -> None:
        self.handle, self.base, self.size = handle, mr_addr, mr_len
        self.whole = _view(mr_addr, mr_len) if mr_len else memoryview(b"")


def _view(address: int, length: int) -> memoryview:
    """A read-only byte view of ``length`` bytes at ``address`` (zero copy)."""
    return memoryview((ctypes.c_uint8 * length).from_address(address)).cast("B").toreadonly()


_HELD_EXPORT = ("frame.data is held by a consumer (an export of its buffer, e.g. "
                "numpy.frombuffer(frame.data)): the frame stays on loan, its slot unavailable "
                "to the sender. Drop the consumer, then release again (or copy the bytes: "
                "frame.tobytes())")


def _release_token(handle: typing.Optional[int], token: int) -> None:
    """Releases a loan (a finalizer's callback: never raises)."""
    try:
        _lib().rocev2_server_release(handle, token)
    except Exception:
        pass


def _release_with(view: memoryview, handle: typing.Optional[int], token: int) -> None:
    """Hands a loan to an exported ``view``: released when the view is freed
    (its consumer dropped it). Not at interpreter exit, while the consumer
    may still read it; the process's end frees the slab."""
    weakref.finalize(view, _release_token, handle, token).atexit = False


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
