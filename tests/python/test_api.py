"""pytest: the ctypes binding against the real library (no RDMA device needed)."""
import ctypes
import os

import pytest

import rocev2
from rocev2 import Mtu, RnrTimer, Rocev2Error


def test_library_loads_and_versions_match():
    assert rocev2.abi_version() == rocev2.ABI_VERSION == 2
    assert rocev2.version().count(".") == 2
    assert isinstance(rocev2.library, ctypes.CDLL)


def test_mtu_table():
    assert [rocev2.PMTU_BYTES[m] for m in Mtu] == [256, 512, 1024, 2048, 4096]
    assert Mtu.MTU_4096 == 5


def test_rnr_timer_table_matches_rogue():
    assert len(RnrTimer) == 32
    assert rocev2.MIN_RNR_TIMER_MS[RnrTimer.MS_655_36] == 655.36
    assert rocev2.MIN_RNR_TIMER_MS[RnrTimer.MS_0_01] == 0.01
    assert rocev2.MIN_RNR_TIMER_MS[RnrTimer.MS_0_64] == 0.64
    assert rocev2.MIN_RNR_TIMER_MS[RnrTimer.MS_491_52] == 491.52
    values = [rocev2.MIN_RNR_TIMER_MS[RnrTimer(c)] for c in range(1, 32)]
    assert values == sorted(values)


def test_transport_cfg_validates_at_construction():
    t = rocev2.TransportCfg()
    assert (t.pmtu, t.minRnrTimer, t.rnrRetry, t.retryCount) == (5, 12, 7, 3)
    with pytest.raises(Rocev2Error, match=r"pmtu must be in the range 1..5 .*got 6"):
        rocev2.TransportCfg(pmtu=6)
    with pytest.raises(Rocev2Error, match=r"minRnrTimer must be an IB RNR timer code 0..31"):
        rocev2.TransportCfg(minRnrTimer=32)


def test_server_cfg_defaults_and_mr_length_guard():
    c = rocev2.ServerCfg(ip="10.0.0.1", deviceName="rxe0")
    assert (c.maxPayload, c.rxQueueDepth, c.gidIndex, c.ibPort) == (4096, 256, -1, 1)
    c = rocev2.ServerCfg(ip="10.0.0.1", deviceName="rxe0", maxPayload=None)
    assert c.maxPayload == rocev2.DEFAULT_MAX_PAYLOAD == 9000
    with pytest.raises(Rocev2Error, match="exceeds 4 GiB"):
        rocev2.ServerCfg(ip="10.0.0.1", deviceName="rxe0", maxPayload=65536, rxQueueDepth=65536)
    for bad in ("not-an-ip", "10.0.0", "10.0.0.256", "", None):
        with pytest.raises(Rocev2Error, match=r"ServerCfg.ip \(the FPGA's address\) must be an IPv4 "
                                              r"address such as '10.0.0.20'; got " + repr(repr(bad))[1:-1]) as e:
            rocev2.ServerCfg(ip=bad, deviceName="rxe0")
        assert e.value.status_name == "INVALID_ARGUMENT"
    with pytest.raises(Rocev2Error, match=r"ServerCfg.bindAddr .* got 'localhost'"):
        rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", bindAddr="localhost")
    with pytest.raises(Rocev2Error, match=r"ServerCfg.peerUdpPort must be in the range 0..65535; got 65536"):
        rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", peerUdpPort=65536)
    with pytest.raises(Rocev2Error, match=r"^ip must be an IPv4 address .* got '1.2.3'"):
        rocev2.ip_to_gid_bytes("1.2.3")
    with pytest.raises(Rocev2Error, match="ibPort"):
        rocev2.ServerCfg(ip="10.0.0.1", deviceName="rxe0", ibPort=0)
    assert c.icrcCheck == "auto"
    with pytest.raises(Rocev2Error, match="icrcCheck must be one of"):
        rocev2.ServerCfg(ip="10.0.0.1", deviceName="soft", icrcCheck="maybe")


def test_gid_helpers_rogue_cases():
    assert rocev2.ip_to_gid_bytes("10.0.0.1") == b"\x00" * 10 + b"\xff\xff\x0a\x00\x00\x01"
    gid = rocev2.gid_bytes_to_str(rocev2.ip_to_gid_bytes("192.168.1.100"))
    assert gid == "0000:0000:0000:0000:0000:ffff:c0a8:0164"
    assert rocev2.host_ip_from_gid(gid) == "192.168.1.100"
    assert rocev2.host_ip_from_gid("0000:0000:0000:0000:0000:FFFF:0a00:0001") == "10.0.0.1"
    assert rocev2.host_ip_from_gid("fe80:0000:0000:0000:0202:c9ff:fe00:0001") == ""
    assert rocev2.host_ip_from_gid("") == ""
    assert rocev2.host_ip_from_gid("0000:0000:0000:0000:0000:ffff:zzzz:0001") == ""
    assert rocev2.parse_gid("::ffff:10.0.0.1") == rocev2.ip_to_gid_bytes("10.0.0.1")
    with pytest.raises(Rocev2Error, match="cannot parse GID") as e:
        rocev2.parse_gid("bogus")
    assert e.value.status_name == "INVALID_ARGUMENT"
    with pytest.raises(Rocev2Error, match="GID must be 16 bytes, got 3"):
        rocev2.gid_bytes_to_str(b"abc")


def _fake_sysfs(root, dev, entries):
    port = root / "class" / "infiniband" / dev / "ports" / "1"
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "gids").mkdir()
    for idx, (typ, gid) in entries.items():
        (port / "gid_attrs" / "types" / str(idx)).write_text(typ + "\n")
        (port / "gids" / str(idx)).write_text(gid + "\n")


def test_detect_gid_index(tmp_path):
    _fake_sysfs(tmp_path, "mlx5_0", {
        0: ("IB/RoCE v1", "fe80:0000:0000:0000:0202:c9ff:fe00:0001"),
        1: ("RoCE v2", "fe80:0000:0000:0000:0202:c9ff:fe00:0001"),
        2: ("IB/RoCE v1", "0000:0000:0000:0000:0000:ffff:0a00:0001"),
        3: ("RoCE v2", "0000:0000:0000:0000:0000:ffff:0a00:0001"),
    })
    assert rocev2.detect_gid_index("mlx5_0", "10.0.0.20", sysfs_root=str(tmp_path)) == 3
    assert rocev2.detect_gid_index("mlx5_0", "172.16.0.1", sysfs_root=str(tmp_path)) is None
    with pytest.raises(Rocev2Error, match=r"RDMA device 'nodev' not found \(devices on this host: mlx5_0\)") as e:
        rocev2.detect_gid_index("nodev", "10.0.0.1", sysfs_root=str(tmp_path))
    assert e.value.status_name == "DEVICE_NOT_FOUND"


def test_detect_gid_index_on_a_host_without_rdma_says_so_first(tmp_path):
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    with pytest.raises(Rocev2Error, match="^No RDMA devices found on this host") as e:
        rocev2.detect_gid_index("mlx5_0", "10.0.0.1", sysfs_root=str(tmp_path))
    assert e.value.status_name == "NO_DEVICE"


def test_validate_channel():
    assert rocev2.validate_channel(0) == 0
    assert rocev2.validate_channel(255) == 255
    for bad in (-1, 256, 1000):
        with pytest.raises(Rocev2Error, match="channel must be in the range 0..255"):
            rocev2.validate_channel(bad)


def test_device_errors_carry_rogue_texts():
    devices = rocev2.list_devices()
    cfg = rocev2.ServerCfg(ip="10.0.0.1", deviceName="rocev2-no-such-device", gidIndex=0)
    with pytest.raises(Rocev2Error) as e:
        rocev2.Server(cfg)
    if not devices:
        assert e.value.status_name == "NO_DEVICE"
        assert "No RDMA devices found" in str(e.value)
    else:
        assert e.value.status_name == "DEVICE_NOT_FOUND"
        assert "not found" in str(e.value)


def test_a_port_in_use_says_what_failed_why_then_what_to_do():
    # Issue 38: the hint stood between what failed and why ("binding UDP
    # ...:N - another process ... or bind another address failed: Address
    # already in use").
    import re
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with pytest.raises(Rocev2Error) as e:
            rocev2.Server(rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", udpPort=port))
    msg = str(e.value)
    # What failed, why, then who holds the port (issue 39: this process,
    # here) and what to do.
    assert re.match(rf"binding UDP 127\.0\.0\.1:{port} failed: [^—]*\(os error 98\) — this process "
                    r"holds it \(a socket on 127\.0\.0\.1:\d+\).*: pick another udp_port", msg), msg


def test_naming_a_device_says_what_is_missing_before_gid_detection():
    # docs/python.md's call (gidIndex auto-detected): on a host without RDMA the
    # error is the device's, not a failed GID detection.
    devices = rocev2.list_devices()
    with pytest.raises(Rocev2Error) as e:
        rocev2.Server(rocev2.ServerCfg(ip="10.0.0.20", deviceName="rocev2-no-such-device"))
    if not devices:
        assert e.value.status_name == "NO_DEVICE"
        assert str(e.value).startswith("No RDMA devices found on this host")
    else:
        assert e.value.status_name == "DEVICE_NOT_FOUND"
        assert "RDMA device 'rocev2-no-such-device' not found" in str(e.value)


def test_log_forwarding(caplog):
    import logging
    rocev2.forward_logs_to_python(4)
    try:
        with caplog.at_level(logging.DEBUG, logger="rocev2.Server"):
            with pytest.raises(Rocev2Error):
                rocev2.parse_gid("nonsense")
        assert any("rocev2_gid_parse failed" in r.getMessage() for r in caplog.records)
    finally:
        rocev2.library.rocev2_set_log_callback(rocev2._LOG_CB(), None, 0)


def _run_python(code, **env):
    import subprocess
    import sys
    e = dict(os.environ, **env)
    if os.environ.get("ROCEV2_TEST_INSTALLED") != "1":
        e["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, cwd="/")


def test_library_env_var_overrides_and_is_never_silently_replaced(tmp_path):
    r = _run_python("import rocev2; print(rocev2.version())", ROCEV2_LIBRARY=str(tmp_path / "missing.so"))
    assert r.returncode != 0
    assert "cannot load librocev2" in r.stderr and "missing.so" in r.stderr
    # The hint gives complete build commands.
    for step in ("pip install ./python", "cmake -S cmake -B build", "cmake --build build",
                 "cmake --install build", "ROCEV2_LIBRARY"):
        assert step in r.stderr, step
    r = _run_python("import rocev2; print(rocev2.library._name)", ROCEV2_LIBRARY=rocev2.library._name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == rocev2.library._name


def test_library_env_var_naming_another_library_is_an_import_error_with_the_hint():
    """Issue 38 finding 9: ROCEV2_LIBRARY naming a library that is not
    librocev2 (here libz) raised AttributeError ("undefined symbol:
    rocev2_version"); it is the ImportError with the build hint."""
    import ctypes.util
    other = ctypes.util.find_library("z") or ctypes.util.find_library("m")
    assert other, "a system library to name"
    r = _run_python("import rocev2; print(rocev2.version())", ROCEV2_LIBRARY=other)
    assert r.returncode != 0
    assert "ImportError: cannot load librocev2" in r.stderr, r.stderr
    assert "AttributeError" not in r.stderr, r.stderr
    assert f"{other}: loaded, but it is not librocev2" in r.stderr, r.stderr
    assert "pip install ./python" in r.stderr


def test_pure_python_parts_import_without_the_library(tmp_path):
    code = ("import rocev2\n"
            "assert rocev2.Mtu.MTU_4096 == 5 and rocev2.RnrTimer.MS_0_64 == 12\n"
            "print(rocev2.PMTU_BYTES[rocev2.Mtu.MTU_1024], rocev2.Status.STOPPED.name)\n"
            "rocev2.ServerCfg(ip='127.0.0.1', deviceName='soft')\n")
    r = _run_python(code, ROCEV2_LIBRARY=str(tmp_path / "missing.so"))
    assert r.stdout.split() == ["1024", "STOPPED"], r.stderr
    assert r.returncode != 0 and "ImportError: cannot load librocev2" in r.stderr


@pytest.mark.skipif(os.environ.get("ROCEV2_TEST_INSTALLED") != "1",
                    reason="checks a `pip install ./python` (./run test runs it in a fresh venv)")
def test_the_installed_package_bundles_its_library():
    assert "ROCEV2_LIBRARY" not in os.environ
    pkg = os.path.dirname(rocev2.__file__)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    assert not pkg.startswith(os.path.join(root, "python")), f"{pkg} is the source tree"
    assert os.path.dirname(rocev2.library._name) == pkg
    files = sorted(f for f in os.listdir(pkg) if f != "__pycache__")
    # The source tree's modules and py.typed (PEP 561), and the library.
    source = [f for f in os.listdir(os.path.join(root, "python", "rocev2")) if f != "__pycache__"]
    assert files == sorted(source + ["librocev2.abi3.so"]), files
    # libibverbs stays a system library: loaded at run time by SONAME, never
    # bundled (the library names it for dlopen).
    with open(rocev2.library._name, "rb") as f:
        assert b"libibverbs.so.1" in f.read()
    import importlib.metadata
    assert rocev2.version() == importlib.metadata.version("rocev2")


def test_version_is_the_crates():
    """rocev2.__version__: the crate's version (Cargo.toml, the one source),
    the library's, and (installed) the distribution's."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "Cargo.toml"), "rb") as f:
        crate = tomllib.load(f)["package"]["version"]
    assert rocev2.__version__ == crate
    assert rocev2.version() == crate
    if os.environ.get("ROCEV2_TEST_INSTALLED") == "1":
        import importlib.metadata
        assert importlib.metadata.version("rocev2") == crate


def test_status_constants_are_the_librarys():
    lib = rocev2.library
    assert [int(s) for s in rocev2.Status] == list(range(len(rocev2.Status)))
    unknown = lib.rocev2_status_str(len(rocev2.Status))
    assert unknown == b"unknown status"
    assert lib.rocev2_status_str(rocev2.Status.STOPPED) == b"stopped"
    assert all(lib.rocev2_status_str(s) != unknown for s in rocev2.Status)
    with pytest.raises(Rocev2Error) as e:
        rocev2.TransportCfg(pmtu=0)
    assert e.value.status is rocev2.Status.INVALID_ARGUMENT
    assert e.value.status_name == "INVALID_ARGUMENT"


def test_struct_layouts_are_checked_against_the_library_at_load():
    lib = rocev2.library
    for which, struct in rocev2._STRUCTS.items():
        assert lib.rocev2_struct_size(which) == ctypes.sizeof(struct), struct.__name__

    class OlderLibrary:
        """The real library, but its rocev2_stats one field shorter."""
        def __getattr__(self, name):
            return getattr(lib, name)

        def rocev2_struct_size(self, which):
            return lib.rocev2_struct_size(which) - (8 if which == 5 else 0)

    with pytest.raises(ImportError, match=r"old\.so: its Stats has \d+ bytes, this binding declares "
                                           r"\d+: the library \(2\.\d+\.\d+\) is older than the binding"):
        rocev2._check_layouts(OlderLibrary(), "old.so")
    rocev2._check_layouts(lib, "this.so")  # the real one passes

    class OtherStatuses(OlderLibrary):
        def rocev2_struct_size(self, which):
            return lib.rocev2_struct_size(which)

        def rocev2_status_str(self, code):
            return b"unknown status" if code >= 16 else lib.rocev2_status_str(code)

    with pytest.raises(ImportError, match=r"status 16 \(INTERNAL\) is unknown to the library"):
        rocev2._check_layouts(OtherStatuses(), "other.so")


def test_code_tables_agree_with_the_librarys_and_it_validates():
    assert {m: rocev2.pmtu_bytes(m) for m in Mtu} == rocev2.PMTU_BYTES
    assert all(rocev2.rnr_timer_us(t) == round(rocev2.MIN_RNR_TIMER_MS[t] * 1000) for t in RnrTimer)
    for bad in (0, 6, -1, "5", None):
        with pytest.raises(Rocev2Error, match="pmtu"):
            rocev2.pmtu_bytes(bad)
    with pytest.raises(Rocev2Error, match="got 32"):
        rocev2.rnr_timer_us(32)
    with pytest.raises(Rocev2Error, match=r"cpu_affinity must be -1 .* got -2"):
        rocev2.ServerCfg(ip="10.0.0.1", deviceName="soft", cpuAffinity=-2)
    with pytest.raises(Rocev2Error, match=r"max_payload must be an integer"):
        rocev2.ServerCfg(ip="10.0.0.1", deviceName="soft", maxPayload=-5)


def test_pattern_check_is_the_librarys():
    good = bytearray(64)
    # A frame the emulator would send: build it with the library's pattern
    # (sequence 7) through a known-good payload of the Rust side's layout.
    seq = 7
    good[:8] = seq.to_bytes(8, "little")
    s = ((seq * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF) >> 32) | 1
    for i in range(8, 64, 4):
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        good[i:i + 4] = s.to_bytes(4, "little")
    assert rocev2.pattern_check(bytes(good)) == 7
    bad = bytearray(good)
    bad[40] ^= 1
    with pytest.raises(ValueError, match=r"frame 7: payload differs at byte 40"):
        rocev2.pattern_check(bad)
    with pytest.raises(ValueError, match=r"frame of 3 bytes is too short"):
        rocev2.pattern_check(b"abc")


def test_the_receive_time_source_follows_the_headers_flags():
    """rocev2_frame.flags' receive-time bits (include/rocev2.h) name the
    stamp: kernel (soft), nic (verbs on a device that stamps completions),
    poll (verbs otherwise)."""
    from rocev2 import _cdecl
    from rocev2._frames import _rx_source
    header = open(os.path.join(os.path.dirname(__file__), "..", "..", "include", "rocev2.h")).read()
    for name, value in (("KERNEL", _cdecl.FRAME_RX_TIME_KERNEL), ("NIC", _cdecl.FRAME_RX_TIME_NIC)):
        assert f"#define ROCEV2_FRAME_RX_TIME_{name} {value}\n" in header, name
    assert _rx_source(_cdecl.FRAME_RX_TIME_KERNEL | _cdecl.FRAME_HAS_IMMEDIATE) == "kernel"
    assert _rx_source(_cdecl.FRAME_RX_TIME_NIC | _cdecl.FRAME_HAS_IMMEDIATE) == "nic"
    assert _rx_source(4) == "poll"
