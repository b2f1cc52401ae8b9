"""Worker groups on other machines, as far as one machine can show it: each
group runs in a network namespace of its own and reaches the PostgreSQL
server over TCP on a veth link (``_network.Link``). One group's link is cut
mid-run (every packet dropped, as a partition looks to TCP) and restored; a
link 20 ms slower each way still gives exact results; a failover between
two servers is followed over TCP.

A loader in this process (over the server's Unix socket) keeps adding hot
keys to a combine queue whose changes an export queue writes into a
PostgreSQL table; the groups run the queues (``children.pg_groups_app``).
Every run ends with the store and the sink exact: the sums of the loader
transactions whose futures resolved, each applied once. The cut runs with
the export queue delivering through an exporter function and natively.

Root is needed for the namespaces (CI runs as root).
"""

from __future__ import annotations

import time

import pytest
from _network import DelayProxy, Link
from _pg_workload import Run, wait_for
from _postgres import temporary_postgres


@pytest.fixture
def links():
    made = []
    try:
        made += [Link(1), Link(2)]
        yield made
    finally:
        for link in made:
            link.close()


@pytest.mark.parametrize("delivery", ["python", "native"])
def test_a_group_cut_off_for_20_s_loses_its_lease_and_rejoins(
    links, tmp_path, monkeypatch, delivery
):
    a, b = links
    with temporary_postgres(tmp_path, tcp=(f"{a.here},{b.here}", Link.subnet)) as server:
        run = Run(f"{server.uri}&schema=partition", server.uri, monkeypatch, delivery == "native")
        try:
            run.start_loading()
            for link in (a, b):
                uri = f"postgresql://postgres@{link.here}:{server.port}/postgres"
                run.start_group(f"{uri}?schema=partition", uri, link)
            wait_for(
                lambda: sorted(run.live_leases().values()) == [2, 2] and run.sink_rows() > 0,
                "both groups at work",
            )
            # A group's leases are named after its command's pid (ip netns
            # exec runs the command in its own process).
            cut_group = next(name for name in run.live_leases() if f":{run.groups[0].pid}:" in name)
            a.cut()
            cut_at = time.monotonic()
            # The cut group's leases lapse; the other group takes its partitions.
            wait_for(
                lambda: (
                    list(run.live_leases()) not in ([], [cut_group])
                    and cut_group not in run.live_leases()
                ),
                "the cut group's leases to lapse",
                30,
            )
            time.sleep(max(0.0, 20 - (time.monotonic() - cut_at)))
            a.restore()
            wait_for(lambda: run.live_leases().get(cut_group) == 2, "the cut group to rejoin", 90)
            errors, applied = run.finish()
            assert applied > 0
            # The cut group's processes lost their connections and made them
            # again: each says so once, however many attempts it took.
            cut_err = errors[0]
            lines = cut_err.count("the connection to the server was lost")
            assert 1 <= lines <= 2, cut_err
        finally:
            run.close()


@pytest.mark.parametrize(
    ("delay", "delivery"), [(0.0, "python"), (0.02, "python"), (0.02, "native")]
)
def test_a_slow_link_still_gives_exact_results(links, tmp_path, monkeypatch, delay, delivery):
    a, _b = links
    with temporary_postgres(tmp_path, tcp=(a.here, Link.subnet)) as server:
        proxy = DelayProxy(a.here, (a.here, server.port), delay)
        run = Run(f"{server.uri}&schema=slow", server.uri, monkeypatch, delivery == "native")
        try:
            uri = f"postgresql://postgres@{a.here}:{proxy.port}/postgres"
            run.start_loading()
            run.start_group(f"{uri}?schema=slow", uri, a)
            wait_for(lambda: run.sink_rows() > 0, "the group at work")
            time.sleep(5)
            _errors, applied = run.finish()
            assert applied > 0
        finally:
            run.close()
            proxy.close()


def test_a_group_over_tcp_follows_a_failover(links, tmp_path, monkeypatch):
    a, _b = links
    subnet = Link.subnet
    with temporary_postgres(tmp_path, synchronous_standby=True, tcp=(a.here, subnet)) as primary:
        standby = primary.make_standby(tcp=(a.here_too, subnet))
        try:
            both = (
                f"postgresql://postgres@{a.here}:{primary.port},{a.here_too}:{standby.port}"
                "/postgres?target_session_attrs=read-write"
            )
            run = Run(f"{both}&schema=tcp_failover", both, monkeypatch)
            try:
                run.start_loading()
                run.start_group(f"{both}&schema=tcp_failover", both, a)
                wait_for(
                    lambda: sum(run.live_leases().values()) == 2 and run.sink_rows() > 0,
                    "the group at work",
                )
                primary.kill()
                time.sleep(0.5)
                standby.promote()
                committed = run.committed()
                wait_for(
                    lambda: run.committed() > committed + 100,
                    "loader commits on the promoted standby",
                )
                errors, _applied = run.finish()
                assert 1 <= errors[0].count("failed over to another server") <= 2, errors[0]
            finally:
                run.close()
        finally:
            standby.stop()
