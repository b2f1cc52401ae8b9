"""The failover of a PostgreSQL cluster run by Patroni, as production runs
one (``_patroni.PatroniCluster``: etcd and three members, synchronous mode),
with a loader and a worker group at work on a URI naming every member: the
leader's machine dies (its Patroni and its postmaster SIGKILLed together),
Patroni promotes the synchronous replica once the leader key expires, and
the run ends exact, the failover seen in status and logged once.
"""

from __future__ import annotations

import pytest
from _patroni import TTL, PatroniCluster
from _pg_workload import Run, wait_for


@pytest.fixture
def cluster():
    made = PatroniCluster()
    try:
        made.start()
        yield made
    finally:
        made.stop()


def test_a_store_rides_through_a_patroni_failover(cluster, monkeypatch):
    # The leader key expires after TTL seconds, then a replica is promoted:
    # percolite keeps trying for longer than that.
    target = f"{cluster.uri}&schema=patroni&reconnect_timeout=60"
    run = Run(target, cluster.uri, monkeypatch)
    try:
        run.start_loading()
        run.start_group(target, cluster.uri)
        wait_for(
            lambda: sum(run.live_leases().values()) == 2 and run.sink_rows() > 0,
            "the group at work",
        )
        # Patroni promotes only the synchronous standby it recorded; a kill
        # within a second or two of a (re)assignment left no candidate in
        # two loaded runs. Kill once one standby has held it for 5 s.
        cluster.wait_for_steady_sync_standby(5)
        old = cluster.leader()
        cluster.kill_node(old)
        committed = run.committed()
        # (the cluster's own wait: on a timeout it shows the members' logs)
        cluster.wait_for(
            lambda: cluster.leader() not in (None, old), "Patroni to promote a replica", TTL + 60
        )
        new = cluster.leader()
        wait_for(lambda: run.committed() > committed + 100, "loader commits on the new leader")
        errors, applied = run.finish()
        assert applied > 0
        server = run.env.status()["server"]
        assert server["address"] == f"127.0.0.1:{cluster.pg_ports[new]}"
        assert server["failovers"] >= 1
        assert 1 <= errors[0].count("failed over to another server") <= 2, errors[0]
    finally:
        run.close()
