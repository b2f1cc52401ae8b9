#!/usr/bin/env bash
# The lock rules, checked by the compiler (make install first): builds the
# core and the extension with clang++ and its thread-safety analysis
# (-Wthread-safety) as errors, so a member GUARDED_BY a mutex read or written
# without it, a REQUIRES function called without the lock, or a lock taken
# twice fails the build (percolite/mutex.h). g++ ignores the annotations;
# this build is where they count. Every other warning fails it too.
set -euo pipefail
cd "$(dirname "$0")/.."
# cmake, ninja and pybind11 come from .venv (requirements-dev.txt).
export PATH="$PWD/.venv/bin:$PATH"
jobs=$(nproc 2>/dev/null || echo 2)

# Debug: the analysis does not depend on optimisation, and -O0 compiles faster.
cmake -S . -B build/thread-safety -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror" \
  -DPERCOLITE_BUILD_PYTHON=ON -DPERCOLITE_BUILD_TESTS=OFF \
  -DPython_EXECUTABLE="$PWD/.venv/bin/python" \
  -Dpybind11_DIR="$(python -m pybind11 --cmakedir)" >/dev/null
cmake --build build/thread-safety -j "$jobs"
echo "check-thread-safety: the core and the extension build with clang -Wthread-safety -Werror"
