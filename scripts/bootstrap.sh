#!/usr/bin/env bash
# Installs everything percolite needs on a Debian-like machine, then builds and
# installs the package into .venv. Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[[ -f /usr/include/lmdb.h ]] || need+=(liblmdb-dev)
[[ -f /usr/include/postgresql/libpq-fe.h ]] || need+=(libpq-dev)
[[ -f /usr/include/catch2/catch.hpp ]] || need+=(catch2)
# SQLite's C API for bench/sqlite_c_upsert.cc, the SQLite sink's measuring stick.
[[ -f /usr/include/sqlite3.h ]] || need+=(libsqlite3-dev)
command -v clang-format >/dev/null || need+=(clang-format)
# clang checks the lock annotations (scripts/check-thread-safety.sh).
command -v clang++ >/dev/null || need+=(clang)
command -v g++ >/dev/null || need+=(g++)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# PostgreSQL for the Postgres exporter's tests, which start a temporary server of their own.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
# A real headless browser for the console's tests (tests/python/test_console_browser.py).
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
# Network namespaces and dropped packets for the PostgreSQL partition tests
# (tests/python/_network.py), and a skewed clock for the lease tests.
command -v ip >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
command -v faketime >/dev/null || need+=(faketime)
# etcd for the Patroni cluster of the failover test, and the system Python's
# venv for Patroni itself (it runs as the postgres user: below).
command -v etcd >/dev/null || need+=(etcd-server)
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# A real HTML tree no one here wrote, for the webindex tests: PostgreSQL's manual.
[[ -f /usr/share/doc/postgresql-doc-15/html/index.html ]] || need+=(postgresql-doc-15)
if ((${#need[@]})); then
  echo "bootstrap: installing ${need[*]} from Debian's packages"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-dev.txt
# Patroni, for the failover test, in a venv of the system's Python. As root,
# the tests run it as the postgres user, who must be able to read it wherever
# this clone is: so it goes to /opt then (tests/python/_patroni.py looks there
# first).
patroni_venv=build/patroni
[[ $(id -u) -eq 0 ]] && patroni_venv=/opt/percolite-tests/patroni
if [[ ! -x $patroni_venv/bin/patroni ]]; then
  /usr/bin/python3 -m venv "$patroni_venv"
  "$patroni_venv"/bin/python -m pip install -q -r requirements-patroni.txt
fi
# Builds the C++ core and the extension (incremental in build/wheel).
.venv/bin/python -m pip install -q --no-build-isolation .
