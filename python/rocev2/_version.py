"""``rocev2.__version__``: the crate's version (Cargo.toml's [package] version),
the one source of the package's version. An installed package has it
written here by setup.py's build step; in a source checkout (python/ on
sys.path) it is read from the Cargo.toml two directories up (a copy of the
package away from both: its distribution's version, else "0+unknown")."""
from __future__ import annotations

import os
import re


def _from_cargo_toml(path: str) -> str:
    """The [package] version of the Cargo.toml at ``path``."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    package = re.search(r"^\[package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = re.search(r'^version\s*=\s*"([^"]+)"', package.group(1), re.M) if package else None
    if found is None:
        raise ValueError(f"{path}: no version in its [package] table")
    return found.group(1)


def _source_version() -> str:
    try:
        return _from_cargo_toml(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Cargo.toml"))
    except OSError:
        import importlib.metadata
        try:
            return importlib.metadata.version("rocev2")
        except importlib.metadata.PackageNotFoundError:
            return "0+unknown"


__version__: str = _source_version()
