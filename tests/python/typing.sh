#!/usr/bin/env bash
# tests/python/typing.sh BUILD_DIR: the package's type check (PEP 561: it
# ships py.typed), mypy --strict with python/pyproject.toml's [tool.mypy].
source "$(dirname "$0")/dist-tools.sh"
dist_tools "$1"
cache="$(cd "$1" && pwd)/mypy-cache"
cd "$ROOT/python"
"$TOOLS/mypy" --strict --cache-dir "$cache" rocev2
