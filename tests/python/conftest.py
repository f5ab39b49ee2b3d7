import os
import sys

# Tests run against the library built by cargo unless ROCEV2_LIBRARY says otherwise.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
if "ROCEV2_LIBRARY" not in os.environ:
    for profile in ("release", "debug"):
        p = os.path.join(ROOT, "target", profile, "librocev2.so")
        if os.path.exists(p):
            os.environ["ROCEV2_LIBRARY"] = p
            break
