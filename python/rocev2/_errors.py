"""The library's status codes and the exception every failed call raises."""
from __future__ import annotations

import enum
import typing


class Status(enum.IntEnum):
    """The library's status codes (``rocev2_status``; ROCEV2_OK,
    ROCEV2_ERR_<name>). Checked against the library at load."""
    OK = 0
    INVALID_ARGUMENT = 1
    NULL_POINTER = 2
    NO_DEVICE = 3
    DEVICE_NOT_FOUND = 4
    DEVICE = 5
    STATE = 6
    TIMEOUT = 7
    STOPPED = 8
    UNSUPPORTED = 9
    IO = 10
    NO_MEMORY = 11
    UNKNOWN_TOKEN = 12
    NOT_FOUND = 13
    BUFFER_TOO_SMALL = 14
    PANIC = 15
    INTERNAL = 16


class Rocev2Error(RuntimeError):
    """A failed library call: ``status`` (a :class:`Status` when the code is
    known, else the int), ``status_name`` and the library's message
    (``str(err)``)."""

    status: typing.Union[Status, int]
    status_name: str

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        try:
            self.status = Status(status)
            self.status_name = self.status.name
        except ValueError:
            self.status = status
            self.status_name = f"status {status}"
