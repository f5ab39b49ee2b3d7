import os
import sys

# Two ways to run:
# - ROCEV2_TEST_INSTALLED=1: against the package installed in this interpreter
#   (`pip install ./python`, what `./run test` does in a fresh venv), with its
#   bundled library unless ROCEV2_LIBRARY is set;
# - otherwise against the source tree (python/) and the library built by cargo
#   (target/{release,debug}) unless ROCEV2_LIBRARY says otherwise.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if os.environ.get("ROCEV2_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(ROOT, "python"))
    if "ROCEV2_LIBRARY" not in os.environ:
        for profile in ("release", "debug"):
            p = os.path.join(ROOT, "target", profile, "librocev2.so")
            if os.path.exists(p):
                os.environ["ROCEV2_LIBRARY"] = p
                break
