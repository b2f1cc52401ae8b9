#!/usr/bin/env bash
# Installs the wheel scripts/build-wheel.sh made into a fresh venv and runs
# a short program (the README's example) with the system's liblmdb and libpq
# hidden: in a private mount namespace (unshare -m, which needs root or user
# namespaces), /dev/null is bind-mounted over every liblmdb.so* and libpq.so*
# file, so only the copies bundled in the wheel can load. .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

wheel=$(ls -t dist/percolite-*manylinux*.whl 2>/dev/null | head -1 || true)
if [[ -z $wheel ]]; then
  echo "test-wheel: no dist/percolite-*manylinux*.whl: run scripts/build-wheel.sh first" >&2
  exit 2
fi
if ! unshare -m true 2>/dev/null; then
  echo "test-wheel: cannot make a mount namespace here (unshare -m needs root or user" \
    "namespaces), so the system liblmdb and libpq cannot be hidden" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index "$wheel"

cat >"$tmp/example.py" <<'PYTHON'
import ctypes
import sys
import tempfile

for system_library in ("liblmdb.so.0", "libpq.so.5"):
    try:
        ctypes.CDLL(system_library)
    except OSError:
        pass
    else:
        sys.exit(f"the system {system_library} is still loadable: the test would prove nothing")

import percolite

app = percolite.App("wordcount")

@app.observer(("doc", "content"))
def count_words(tx, row, column):
    tx.set(row, ("doc", "words"), str(len(tx.get(row, column).split())))

with tempfile.TemporaryDirectory() as scratch:
    with percolite.open(f"{scratch}/docs.db", app=app) as env:
        with env.transaction() as tx:
            tx.set("doc:1", ("doc", "content"), "the quick brown fox")
        env.process(threads=2)
        with env.transaction() as tx:
            words = tx.get("doc:1", ("doc", "words"))
assert words == b"4", words
print(f"percolite {percolite.__version__} from the wheel, without the system liblmdb and libpq: ok")
PYTHON

libs=$(ls /usr/lib/*/liblmdb.so* /usr/lib/liblmdb.so* /usr/local/lib/liblmdb.so* \
  /usr/lib/*/libpq.so* /usr/lib/libpq.so* /usr/local/lib/libpq.so* 2>/dev/null || true)
hide=""
for lib in $libs; do
  [[ -L $lib ]] || hide+="mount --bind /dev/null '$lib' && "
done
unshare -m sh -c "${hide}exec '$tmp/venv/bin/python' '$tmp/example.py'"
