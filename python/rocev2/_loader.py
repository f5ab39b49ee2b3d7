"""Finding and loading librocev2 (at first use), and the helpers every
call goes through: status checks, the library's last error, the size
protocol's answer."""
from __future__ import annotations

import ctypes
import os
import threading
import typing

from ._cdecl import ABI_VERSION, _STRUCTS, _declare
from ._errors import Rocev2Error, Status


_HERE = os.path.dirname(os.path.abspath(__file__))

_BUILD_HINT = (
    "Build and bundle it: `pip install ./python` in a rocev2 checkout (needs cargo, "
    "libibverbs-dev, librdmacm-dev, libclang-dev); or install the C library: "
    "`cmake -S cmake -B build -DCMAKE_INSTALL_PREFIX=/usr/local && cmake --build build && "
    "cmake --install build && ldconfig`; or point ROCEV2_LIBRARY at a built "
    "librocev2.so.2 (e.g. build/install/lib/librocev2.so.2 after `./run test`)."
)


def _candidates() -> typing.List[str]:
    """Where the library is looked for: ``$ROCEV2_LIBRARY`` alone when set
    (an override is never silently replaced by another copy); else the copy
    bundled in this package (``pip install``), then the system loader."""
    env = os.environ.get("ROCEV2_LIBRARY")
    if env:
        return [env]
    bundled = sorted(os.path.join(_HERE, n) for n in os.listdir(_HERE)
                     if n.startswith("librocev2") and ".so" in n)
    return bundled + ["librocev2.so.2"]


def _load() -> ctypes.CDLL:
    errors = []
    for cand in _candidates():
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            errors.append(f"{cand}: {e}")
            continue
        try:
            _declare(lib)
        except AttributeError as e:  # another library: not rocev2's symbols
            errors.append(f"{cand}: loaded, but it is not librocev2 ({e})")
            continue
        if lib.rocev2_abi_version() != ABI_VERSION:
            raise ImportError(f"{cand} has C ABI version {lib.rocev2_abi_version()}, "
                              f"this package needs {ABI_VERSION}")
        _check_layouts(lib, cand)
        return lib
    raise ImportError("cannot load librocev2. " + _BUILD_HINT + " Tried:\n  " + "\n  ".join(errors))


_library: typing.Optional[ctypes.CDLL] = None
_load_lock = threading.Lock()
# The release calls, set at load: the paths that end loans call them
# without a Python call in between (a Python call is where a signal handler
# may run, see rocev2._frames.Frame).
RELEASE: typing.Any = None
RELEASE_MANY: typing.Any = None


def _lib() -> ctypes.CDLL:
    """The loaded library, loaded at first use (so the module and its code
    tables, ``Mtu``, ``RnrTimer``, ``Status``, import without it)."""
    global _library, RELEASE, RELEASE_MANY
    if _library is None:
        with _load_lock:
            if _library is None:
                lib = _load()
                RELEASE, RELEASE_MANY = lib.rocev2_server_release, lib.rocev2_server_release_many
                _library = lib
    return _library


_raw_calls: typing.Dict[str, typing.Any] = {}


def _raw(name: str) -> typing.Any:
    """``name`` from the library without ctypes' argument conversion (its
    argtypes cost about 0.5 us a call): for the batch path's calls, whose
    callers pass exactly the C types (c_void_p, c_int32, c_size_t, arrays,
    byref). Returns the C status."""
    fn = _raw_calls.get(name)
    if fn is None:
        lib = _lib()
        fn = lib._FuncPtr((name, lib))
        fn.restype = ctypes.c_int
        _raw_calls[name] = fn
    return fn


def _check_layouts(lib: ctypes.CDLL, path: str) -> None:
    """Refuses a library whose structs are smaller than this binding's
    declarations (an older library: fields the binding would read or set are
    not there) or whose status codes differ. A larger struct (a newer
    library) is fine: the size protocol gives the binding its own size."""
    for which, struct in _STRUCTS.items():
        theirs, ours = lib.rocev2_struct_size(which), ctypes.sizeof(struct)
        if theirs < ours:
            raise ImportError(
                f"{path}: its {struct.__name__[1:]} has {theirs} bytes, this binding "
                f"declares {ours}: the library ({lib.rocev2_version().decode()}) is older than "
                f"the binding. Install the matching library, or the package built "
                f"with it (`pip install ./python`).")
    unknown = lib.rocev2_status_str(len(Status))
    for st in Status:
        text = lib.rocev2_status_str(int(st))
        if text == unknown:
            raise ImportError(f"{path}: status {int(st)} ({st.name}) is unknown to the "
                              f"library; the binding and library disagree on the status codes")


def _answered(written: ctypes.Structure, fn: str) -> None:
    """The size protocol's answer: the library wrote the whole struct (a
    shorter answer would leave fields unwritten; _check_layouts refuses such
    a library at load, so this guards against a library swapped since)."""
    if written.struct_size != ctypes.sizeof(written):
        raise Rocev2Error(Status.INTERNAL, f"{fn} wrote {written.struct_size} bytes of "
                          f"{type(written).__name__[1:]}, the binding needs {ctypes.sizeof(written)}")


def _last_error() -> str:
    n = _lib().rocev2_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _lib().rocev2_last_error(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def _check(status: int) -> None:
    if status != Status.OK:
        raise Rocev2Error(status, _last_error())


def version() -> str:
    """The library version string."""
    return typing.cast(bytes, _lib().rocev2_version()).decode()


def abi_version() -> int:
    """The library's C ABI version."""
    return int(_lib().rocev2_abi_version())


def list_devices() -> typing.List[str]:
    """Names of the ibverbs devices on this host."""
    count = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(4096)
    _check(_lib().rocev2_device_list(buf, len(buf), ctypes.byref(count)))
    return [n for n in buf.value.decode().split(",") if n]
