"""Logging: forward library records to Python's logging ("rocev2.Server")."""
from __future__ import annotations

import logging
import typing

from ._cdecl import _LOG_CB
from ._loader import _check, _lib


_log_cb_ref: typing.Any = None  # the C function pointer, alive while the library may call it


def forward_logs_to_python(level: int = 3) -> None:
    """Routes library logs to the Python logger ``rocev2.Server`` (level:
    0 off .. 5 trace; default 3 = info)."""
    import logging
    logger = logging.getLogger("rocev2.Server")
    py_level = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: logging.DEBUG}

    def on_log(_user: typing.Optional[int], lvl: int, target: bytes, message: bytes) -> None:
        logger.log(py_level.get(lvl, logging.INFO), "%s", message.decode("utf-8", "replace"))

    global _log_cb_ref
    _log_cb_ref = _LOG_CB(on_log)
    _check(_lib().rocev2_set_log_callback(_log_cb_ref, None, level))
