"""The channel demultiplexer: frames that ``Server.poll(channel=...)`` takes
for other channels, kept for their readers, and :class:`ChannelView`, one
channel's pull API."""
from __future__ import annotations

import collections
import logging
import threading
import typing

if typing.TYPE_CHECKING:
    from ._frames import Frame
    from ._server import Server


class _Demux:
    """Frames a reader of one channel took for other channels, kept for
    their readers as (arrival number, frame) per channel; at most
    ``keep_max`` in all (half the receive queue), beyond which the oldest is
    released and counted (:attr:`drops`): unread channels must not hold the
    slots."""

    def __init__(self, keep_max: int):
        self._lock = threading.Lock()
        self._pending: typing.DefaultDict[int, typing.Deque[typing.Tuple[int, Frame]]] = \
            collections.defaultdict(collections.deque)
        self.kept = 0
        self._arrivals = 0
        self.keep_max = keep_max
        self.drops = 0

    def take_oldest(self) -> typing.Optional[Frame]:
        """The oldest kept frame of any channel, or None."""
        if not self.kept:
            return None
        with self._lock:
            queues = [q for q in self._pending.values() if q]
            if not queues:
                return None
            self.kept -= 1
            return min(queues, key=lambda q: q[0][0]).popleft()[1]

    def take(self, channel: int) -> typing.Optional[Frame]:
        """The oldest kept frame of ``channel``, or None."""
        with self._lock:
            if self._pending[channel]:
                self.kept -= 1
                return self._pending[channel].popleft()[1]
        return None

    def keep(self, f: Frame, reader: int) -> None:
        """Keeps ``f``, taken by a reader of channel ``reader``, for its own
        channel's reader. Beyond :attr:`keep_max` kept frames the oldest kept
        is released (counted in :attr:`drops`, logged the first time): a
        channel nobody reads must not hold the receive queue's slots (the
        link would stall under RNR NAKs)."""
        with self._lock:
            self._arrivals += 1
            self._pending[f.channel].append((self._arrivals, f))
            self.kept += 1
            if self.kept <= self.keep_max:
                return
            oldest = min((q for q in self._pending.values() if q), key=lambda q: q[0][0])
            dropped = oldest.popleft()[1]
            self.kept -= 1
            self.drops += 1
            first = self.drops == 1
        if first:
            logging.getLogger("rocev2.Server").warning(
                "poll(channel=%d) keeps at most %d frames of other channels for their readers "
                "(half the receive queue); released unread: the oldest kept, of channel %d "
                "(Server.channel_drops counts them; this is logged once)",
                reader, self.keep_max, dropped.channel)
        dropped.release()


class ChannelView:
    """Frames of one channel of a :class:`Server` (pull API). Frames of
    other channels that arrive meanwhile are kept for their readers
    (``server.poll()``, another view), at most ``rxQueueDepth // 2`` of them:
    beyond that the oldest kept is released unread and counted in
    ``server.channel_drops``, so channels nobody reads do not stall the link."""

    def __init__(self, server: Server, channel: int):
        self.server = server
        self.channel = channel

    def poll(self, timeout: typing.Optional[float] = None) -> typing.Optional[Frame]:
        return self.server.poll(timeout, self.channel)

    def __iter__(self) -> typing.Iterator[Frame]:
        return self.server.frames(channel=self.channel)
