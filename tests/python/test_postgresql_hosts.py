"""Which server a postgresql store reaches: several hosts in one URI (the
first one that accepts writes), a server that never answers (an error within
the connect timeout, never a hang), and the target attributes a writing
store refuses; the PostgreSQL sink likewise.

Every server here is on this machine: the session's (a Unix socket), or a
TCP socket of the test's own that accepts connections and never answers, as
a host that vanished would look to libpq.
"""

from __future__ import annotations

import socket
import time

import percolite
import pytest
from percolite import SequencedExport
from percolite.exporters import Postgres

COL = ("f", "q")


@pytest.fixture
def silent_host():
    """``(host, port)`` of a TCP socket that takes connections (the kernel
    completes the handshake) and never says a word."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield listener.getsockname()
    finally:
        listener.close()


def _hosts_uri(hosts: list[str], ports: list[int], extra: str = "") -> str:
    return (
        f"postgresql://postgres@/postgres?host={','.join(hosts)}"
        f"&port={','.join(map(str, ports))}{extra}"
    )


def test_a_store_on_several_hosts_goes_past_one_that_is_down(postgres_server, tmp_path):
    server = postgres_server
    missing = tmp_path / "no-server-here"  # a socket directory with no socket in it
    missing.mkdir()
    target = _hosts_uri(
        [str(missing), str(server.socket_dir)], [server.port, server.port], "&schema=past_one_down"
    )
    with percolite.open(target) as env:
        env.run(lambda tx: tx.set("r", COL, b"written"))
        assert env.run(lambda tx: tx.get("r", COL)) == b"written"


def test_a_host_that_never_answers_is_left_after_the_connect_timeout(postgres_server, silent_host):
    host, port = silent_host
    target = _hosts_uri(
        [host, str(postgres_server.socket_dir)],
        [port, postgres_server.port],
        "&connect_timeout=2&schema=past_silent",
    )
    began = time.monotonic()
    with percolite.open(target) as env:
        env.run(lambda tx: tx.set("r", COL, b"v"))
    # libpq gives each host its own timeout, then tries the next.
    assert 1.5 <= time.monotonic() - began


def test_no_reachable_host_is_a_clear_error_not_a_hang(tmp_path, silent_host):
    host, port = silent_host
    gone = [tmp_path / "a", tmp_path / "b"]
    for directory in gone:
        directory.mkdir()
    with pytest.raises(percolite.StorageError, match="cannot connect"):
        percolite.open(_hosts_uri([str(d) for d in gone], [5432, 5432]))
    began = time.monotonic()
    with pytest.raises(percolite.StorageError, match="cannot connect"):
        percolite.open(f"postgresql://postgres@{host}:{port}/postgres?connect_timeout=1")
    assert time.monotonic() - began < 30  # the timeout, not TCP's many minutes


@pytest.mark.parametrize("attrs", ["any", "standby", "read-only", "prefer-standby"])
def test_a_writing_store_refuses_target_attributes_that_allow_a_standby(postgres_server, attrs):
    with pytest.raises(ValueError, match=f"target_session_attrs={attrs}.*primary"):
        percolite.open(f"{postgres_server.uri}&target_session_attrs={attrs}")


@pytest.mark.parametrize("attrs", ["read-write", "primary"])
def test_a_writing_store_takes_the_primary_attributes(postgres_server, attrs):
    schema = "attrs_" + attrs.replace("-", "_")
    uri = f"{postgres_server.uri}&target_session_attrs={attrs}&schema={schema}"
    with percolite.open(uri) as env:
        env.run(lambda tx: tx.set("r", COL, b"v"))


def test_reconnect_timeout_is_a_setting_of_the_target(postgres_server):
    uri = f"{postgres_server.uri}&reconnect_timeout=5&schema=reconnect_set"
    with percolite.open(uri) as env:
        env.run(lambda tx: tx.set("r", COL, b"v"))
    for bad in ("0", "soon", "61"):
        with pytest.raises(ValueError, match="reconnect_timeout"):
            percolite.open(f"{postgres_server.uri}&reconnect_timeout={bad}")


def test_the_postgres_sink_goes_past_a_host_that_is_down(postgres_server, tmp_path):
    missing = tmp_path / "no-server-here"
    missing.mkdir()
    dsn = _hosts_uri([str(missing), str(postgres_server.socket_dir)], [5432, postgres_server.port])
    with Postgres(dsn, "past_down", key="k", columns="v") as sink:
        sink([SequencedExport("a", 1, 1)])
        assert sink.rows() == {"a": 1}


def test_the_postgres_sink_notices_a_silent_server_within_its_connect_timeout(silent_host):
    host, port = silent_host
    with Postgres(f"postgresql://postgres@{host}:{port}/postgres", "t", connect_timeout=1) as sink:
        began = time.monotonic()
        with pytest.raises(ConnectionError, match="cannot connect"):
            sink([SequencedExport("a", 1, 1)])
        assert time.monotonic() - began < 30
