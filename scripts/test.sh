#!/usr/bin/env bash
# Runs every test: the core's Catch2 tests through ctest, then pytest.
# Exits non-zero on any failure. Run scripts/bootstrap.sh first (make test does).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPERCOLITE_BUILD_PYTHON=OFF -DPERCOLITE_BUILD_TESTS=ON >/dev/null
cmake --build build/cpp -j "$jobs"
# With a temporary PostgreSQL server: the conformance tests run the
# postgresql backend too (tests/python/_postgres.py sets PERCOLITE_TEST_POSTGRES).
.venv/bin/python tests/python/_postgres.py \
  ctest --test-dir build/cpp --output-on-failure -j "$jobs"

.venv/bin/python -m pytest "$@"
