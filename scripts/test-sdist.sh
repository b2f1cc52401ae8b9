#!/usr/bin/env bash
# The source distribution: `python -m build --sdist` makes it, and installing
# it on a machine without liblmdb-dev stops at once with a message naming the
# package, not a compiler or CMake trace. The missing package is simulated
# with CMake's own CMAKE_IGNORE_PATH over the system's header and library
# folders (so find_path/find_library find no LMDB), on the real sdist.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/sdist-test
rm -rf "$out" && mkdir -p "$out"
.venv/bin/python -m build --sdist --no-isolation --outdir "$out" . >"$out/build.log" 2>&1 ||
  { cat "$out/build.log"; exit 1; }
sdist=$(ls "$out"/percolite-*.tar.gz)
echo "test-sdist: built $sdist"
ignored="/usr/include;/usr/lib/x86_64-linux-gnu;/usr/lib;/lib/x86_64-linux-gnu"
if CMAKE_ARGS="-DCMAKE_IGNORE_PATH=$ignored" .venv/bin/python -m pip install --no-build-isolation \
  --no-deps --target "$out/site" "$sdist" >"$out/install.log" 2>&1; then
  echo "test-sdist: installing without LMDB succeeded: the check did not run"; exit 1
fi
if ! grep -q "LMDB not found: install the Debian package 'liblmdb-dev'" "$out/install.log"; then
  echo "test-sdist: installing without LMDB failed without naming liblmdb-dev:"
  tail -30 "$out/install.log"; exit 1
fi
echo "test-sdist: without LMDB the install stops naming liblmdb-dev"
