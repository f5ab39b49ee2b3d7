"""Builds librocev2 (the crate, as a cdylib) with cargo and bundles it inside
the package as rocev2/librocev2.abi3.so, so that ``pip install ./python``
(or of the sdist, or the wheel) gives a package that imports with no
environment variable.

The crate: in a rocev2 checkout, the one directory up (../Cargo.toml); in an
sdist, its copy in crate/, which the sdist step below puts there
(Cargo.toml, Cargo.lock, build.rs, cbindgen.toml, src/, include/ and the
example the manifest names), so that an sdist builds anywhere with cargo.

Build needs: a Rust toolchain (cargo; crates come from crates.io, pinned by
Cargo.lock), and for the verbs backend (the default) libibverbs-dev,
librdmacm-dev and libclang-dev. ``ROCEV2_CARGO_FEATURES``, when set, replaces
the crate's default features: empty builds the soft backend only (no
libibverbs needed to build), ``verbs`` is the default.

The version is the crate's (Cargo.toml [package] version), the package's one
source: the build writes it into rocev2/_version.py.
"""
import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools_rust import Binding, RustExtension, Strip

HERE = os.path.dirname(os.path.abspath(__file__))
# What the sdist carries of the crate: everything cargo needs to build the library.
CRATE_FILES = ("Cargo.toml", "Cargo.lock", "build.rs", "cbindgen.toml")
CRATE_TREES = ("src", "include", os.path.join("examples", "rust"))


def crate_dir():
    """The crate: an sdist's copy (crate/), else the checkout's (..)."""
    for d in (os.path.join(HERE, "crate"), os.path.dirname(HERE)):
        if os.path.exists(os.path.join(d, "Cargo.toml")):
            return d
    raise SystemExit(f"rocev2: no Cargo.toml in {HERE}/crate (an sdist) nor in {os.path.dirname(HERE)} "
                     f"(a rocev2 checkout): build from a checkout (pip install ./python) or a complete sdist")


def crate_version(cargo_toml):
    """The [package] version of ``cargo_toml``."""
    with open(cargo_toml, encoding="utf-8") as f:
        text = f.read()
    package = re.search(r"^\[package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = re.search(r'^version\s*=\s*"([^"]+)"', package.group(1), re.M) if package else None
    if found is None:
        raise SystemExit(f"rocev2: {cargo_toml} has no [package] version")
    return found.group(1)


CRATE = crate_dir()
VERSION = crate_version(os.path.join(CRATE, "Cargo.toml"))


def write_version(package_dir):
    """rocev2/_version.py under ``package_dir`` as the literal version (a new
    file: the one there may be a hard link to the source tree's)."""
    path = os.path.join(package_dir, "rocev2", "_version.py")
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write('"""``rocev2.__version__``: the crate\'s version, written by setup.py at build time."""\n'
                f'__version__: str = "{VERSION}"\n')


class BuildPy(build_py):
    def run(self):
        super().run()
        write_version(self.build_lib)


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        write_version(base_dir)
        dest = os.path.join(base_dir, "crate")
        if CRATE == dest:
            return
        self.mkpath(dest)
        for name in CRATE_FILES:
            self.copy_file(os.path.join(CRATE, name), os.path.join(dest, name))
        for tree in CRATE_TREES:
            self.copy_tree(os.path.join(CRATE, tree), os.path.join(dest, tree))


features = os.environ.get("ROCEV2_CARGO_FEATURES")
setup(
    version=VERSION,
    cmdclass={"build_py": BuildPy, "sdist": Sdist},
    rust_extensions=[
        RustExtension(
            "rocev2.librocev2",
            path=os.path.relpath(os.path.join(CRATE, "Cargo.toml")),
            binding=Binding.NoBinding,
            py_limited_api=True,
            strip=Strip.Debug,
            cargo_manifest_args=["--locked"],
            args=[] if features is None else ["--no-default-features"],
            features=(features or "").replace(",", " ").split(),
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp38"}},
    zip_safe=False,
)
