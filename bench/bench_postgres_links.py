"""A worker group reaching PostgreSQL over a network link, with and without
added delay, side by side.

A temporary server (``tests/python/_postgres.py``, ``fsync`` and
``synchronous_commit`` on) listens on one end of a veth pair; a worker group
(``percolite worker pg_app:app --processes 1 --threads 4 --until-idle``)
runs in a network namespace at the other end (``tests/python/_network.py``),
so every round trip crosses the link. Each round loads a backlog of BACKLOG
combine-queue transactions (``bench_hotkeys``' draws, through a loader in
this process, over the server's Unix socket), then times the group from its
start until it exits with every value final (checked exact). The group
reaches the server through a TCP proxy that delays every chunk by 0 ms or by
``--delay`` ms each way (this kernel has no ``netem``), the two in rotating
order, each round on a fresh schema.

Reports combine-queue updates folded per second (median of the rounds) and
the ratio delayed / no delay of each round. No target: the figure says what
a slow link costs (a batch is two round trips, whatever its size).
Needs root (network namespaces, as the tests). ``python
bench/bench_postgres_links.py [--backlog N] [--rounds R] [--delay MS]``;
report in ``bench/results/postgres_links.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import percolite
from bench_postgresql import load_backlog
from common import BENCH_DIR, REPO_ROOT, RESULTS_DIR, scratch_dir

sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))
sys.path.insert(0, str(BENCH_DIR))
import _network  # noqa: E402 - the tests' links and proxy
import _postgres  # noqa: E402 - the tests' temporary server
import pg_app  # noqa: E402 - the app the group runs

GROUP_THREADS = 4


def run_round(server, link, delay_s: float, backlog: int, schema: str, seed: int) -> float:
    """Updates folded per second by a group over ``link`` through a proxy
    delaying ``delay_s`` each way."""
    local = f"{server.uri}&schema={schema}"
    expected = load_backlog(local, backlog, seed)
    proxy = _network.DelayProxy(link.here, (link.here, server.port), delay_s)
    try:
        uri = f"postgresql://postgres@{link.here}:{proxy.port}/postgres?schema={schema}"
        command = [sys.executable, "-m", "percolite", "worker", "pg_app:app", "--processes", "1"]
        command += ["--threads", str(GROUP_THREADS), "--until-idle"]
        began = time.perf_counter()
        code = subprocess.call(
            link.command(command),
            cwd=BENCH_DIR,
            env={**os.environ, "PERCOLITE_DB": uri},
            stdout=subprocess.DEVNULL,
            timeout=1800,
        )
        elapsed = time.perf_counter() - began
    finally:
        proxy.close()
    with percolite.open(local, app=pg_app.app) as env, env.transaction() as tx:
        final = dict(pg_app.hot.scan(tx))
    if code != 0 or final != expected:
        raise SystemExit(f"the group over a {delay_s * 1000:.0f} ms link ended wrong (exit {code})")
    return sum(expected.values()) / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=2000, help="transactions per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay", type=float, default=20, help="ms each way (default 20)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "postgres_links.json")
    args = parser.parse_args(argv)
    _network.need_network_tools()
    link = _network.Link(1)
    delays = {"no delay": 0.0, f"{args.delay:g} ms": args.delay / 1000}
    rates: dict[str, list[float]] = {name: [] for name in delays}
    try:
        with (
            scratch_dir(RESULTS_DIR, "links-") as scratch,
            _postgres.temporary_postgres(
                scratch, durable=True, tcp=(link.here, link.subnet)
            ) as server,
        ):
            names = list(delays)
            for round_ in range(args.rounds):
                for turn, name in enumerate(names[round_ % 2 :] + names[: round_ % 2]):
                    schema = f"links_{round_}_{turn}"
                    rate = run_round(server, link, delays[name], args.backlog, schema, round_)
                    rates[name].append(rate)
                    print(f"round {round_}: {name}: {rate:,.0f} updates/s", file=sys.stderr)
    finally:
        link.close()
    slow, fast = rates[names[1]], rates[names[0]]
    report = {
        "backlog": args.backlog,
        "rounds": args.rounds,
        "delay_ms_each_way": args.delay,
        "group_threads": GROUP_THREADS,
        "updates_per_s": {name: round(statistics.median(r), 1) for name, r in rates.items()},
        "ratio_delayed_to_none": [round(s / f, 3) for s, f in zip(slow, fast, strict=True)],
    }
    print(f"{'link':<12}{'updates/s':>12}")
    for name in names:
        print(f"{name:<12}{report['updates_per_s'][name]:>12,.0f}")
    print(f"delayed / no delay, by round: {report['ratio_delayed_to_none']}")
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
