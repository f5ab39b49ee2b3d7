#!/usr/bin/env bash
# tests/python/sdist.sh BUILD_DIR: the Python sdist holds everything needed to
# build librocev2 (the crate in crate/) and installs from itself alone: built
# with `python -m build --sdist`, its contents checked, then `pip install`ed
# into a fresh venv (no checkout in reach: pip unpacks it in a temporary
# directory; needs cargo and, for the default features, libibverbs-dev) and
# imported from outside the checkout. Leaves BUILD_DIR/dist/rocev2-*.tar.gz.
source "$(dirname "$0")/dist-tools.sh"
build=$1
dist_tools "$build"
build=$(cd "$build" && pwd)
rm -rf "$build/dist" "$build/venv-sdist"
quietly "$TOOLS/python" -m build --sdist -o "$build/dist" "$ROOT/python"
sdist=$(ls "$build"/dist/rocev2-*.tar.gz)
version=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml")
"$TOOLS/python" - "$sdist" "$version" "$ROOT" <<'PY'
import os, sys, tarfile
sdist, version, root = sys.argv[1:]
top = f"rocev2-{version}/"
with tarfile.open(sdist) as t:
    names = {n[len(top):] for n in t.getnames() if n.startswith(top)}
    written = t.extractfile(top + "rocev2/_version.py").read().decode()
want = {"pyproject.toml", "setup.py", "rocev2/py.typed", "crate/Cargo.toml", "crate/Cargo.lock",
        "crate/build.rs", "crate/cbindgen.toml", "crate/include/rocev2.h"}
want |= {"rocev2/" + f for f in os.listdir(os.path.join(root, "python", "rocev2")) if f.endswith(".py")}
for d, _, files in os.walk(os.path.join(root, "src")):
    want |= {os.path.relpath(os.path.join(d, f), root).replace("src/", "crate/src/", 1) for f in files}
missing = sorted(want - names)
assert not missing, f"{sdist} lacks {missing}"
assert f'__version__: str = "{version}"' in written, written
print(f"sdist: {os.path.basename(sdist)}, {len(names)} files, the crate's {len(want)} needed ones among them")
PY
python3 -m venv "$build/venv-sdist"
echo "==> pip install $(basename "$sdist") into a fresh venv (cargo builds librocev2 from the sdist's crate/)" >&2
quietly "$build/venv-sdist/bin/python" -m pip install "$sdist"
cd /
"$build/venv-sdist/bin/python" - "$version" <<'PY'
import importlib.metadata, os, sys
import rocev2
version = sys.argv[1]
here = os.path.dirname(rocev2.__file__)
assert os.path.dirname(rocev2.library._name) == here, (rocev2.library._name, here)
assert rocev2.__version__ == importlib.metadata.version("rocev2") == rocev2.version() == version, \
    (rocev2.__version__, importlib.metadata.version("rocev2"), rocev2.version(), version)
assert os.path.exists(os.path.join(here, "py.typed"))
rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft")  # validated by the bundled library
print(f"sdist install: rocev2 {rocev2.__version__} imports, its bundled library {rocev2.library._name}")
PY
# PEP 561: a consumer type-checks against the installed package (its py.typed).
echo "==> mypy --strict examples/python/stream.py against the installed package (PEP 561)" >&2
"$TOOLS/mypy" --strict --no-incremental --python-executable "$build/venv-sdist/bin/python" \
    "$ROOT/examples/python/stream.py"
