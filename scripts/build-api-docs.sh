#!/usr/bin/env bash
# The API reference: pdoc renders the installed package's docstrings and
# signatures into build/api-docs/ (open index.html). Any warning fails the
# build (an annotation it cannot resolve, a module it cannot import), so CI
# keeps the reference whole. Run scripts/bootstrap.sh first (make api-docs does).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/api-docs}
rm -rf "$out"
.venv/bin/python -W error -m pdoc --docformat restructuredtext percolite -o "$out"
echo "build-api-docs: wrote $out/index.html"
