"""A PostgreSQL cluster run by Patroni, as production runs one, for the
failover tests: one etcd (Debian's ``etcd-server``) as Patroni's store and
three members, each a Patroni process with its PostgreSQL server, all on
127.0.0.1 (free ports picked at start).

Patroni comes from a virtual environment of the system's Python that
``scripts/bootstrap.sh`` makes from ``requirements-patroni.txt``: as root,
``/opt/percolite-tests/patroni``, and the members run as Debian's
``postgres`` user (PostgreSQL refuses root), who can read it there;
otherwise ``build/patroni``, run as the user running the tests.

Timings are short, so that a failover completes well within a store's
``reconnect_timeout``: the leader key lives ``TTL`` seconds, each member
looks every ``LOOP_WAIT`` second. ``synchronous_mode`` is on: Patroni keeps
one replica synchronous and promotes only it, so no commit a client was told
of is lost in a failover.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from _postgres import SERVER_USER, find_postgres_bin

__all__ = ["PatroniCluster"]

REPO = Path(__file__).resolve().parents[2]
AS_ROOT = os.geteuid() == 0
PATRONI = (
    Path("/opt/percolite-tests/patroni") if AS_ROOT else REPO / "build" / "patroni"
) / "bin/patroni"
TTL = 10
LOOP_WAIT = 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PatroniCluster:
    """``start()`` brings up etcd and three members and waits until one
    leads and two stream; ``uri`` names every member; ``kill_node(name)``
    kills a member's Patroni and postmaster together, as when its machine
    dies; ``stop()`` kills everything and removes the directory."""

    def __init__(self, members: int = 3) -> None:
        if not PATRONI.exists():
            raise RuntimeError(f"{PATRONI} is missing: run scripts/bootstrap.sh")
        bin_dir = find_postgres_bin()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed: run scripts/bootstrap.sh")
        self.bin_dir = bin_dir
        self.base = Path(tempfile.mkdtemp(prefix="percolite-patroni-"))
        if AS_ROOT:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.base, user.pw_uid, user.pw_gid)
            os.chmod(self.base, 0o755)
        self.names = [f"m{i}" for i in range(members)]
        self.pg_ports = {name: _free_port() for name in self.names}
        self.api_ports = {name: _free_port() for name in self.names}
        self.etcd_ports = (_free_port(), _free_port())
        self._processes: dict[str, subprocess.Popen] = {}
        self.uri = (
            "postgresql://postgres@"
            + ",".join(f"127.0.0.1:{self.pg_ports[n]}" for n in self.names)
            + "/postgres?target_session_attrs=read-write"
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.base / f"{name}.log", "w") as log:  # the child keeps its copy
            self._processes[name] = subprocess.Popen(
                ["runuser", "-u", SERVER_USER, "--", *argv] if AS_ROOT else argv,
                cwd=self.base,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed whole
            )

    def _config(self, name: str) -> Path:
        client = f"127.0.0.1:{self.etcd_ports[0]}"
        api, port = self.api_ports[name], self.pg_ports[name]
        config = {
            "scope": "percolite",
            "name": name,
            "restapi": {"listen": f"127.0.0.1:{api}", "connect_address": f"127.0.0.1:{api}"},
            "etcd3": {"hosts": client},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": 4,
                    "synchronous_mode": True,
                    # Patroni promotes no replica that lags the leader's last
                    # known WAL position by more than this; under a loader's
                    # writes on a busy machine the default 1 MB can hold
                    # every replica back, and synchronous mode already
                    # keeps every commit a client was told of.
                    "maximum_lag_on_failover": 1 << 30,
                    "postgresql": {
                        "parameters": {"fsync": "off", "full_page_writes": "off"},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "local replication all trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{port}",
                "connect_address": f"127.0.0.1:{port}",
                "data_dir": str(self.base / name),
                "bin_dir": str(self.bin_dir),
                "pgpass": str(self.base / f"{name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.base)},
            },
        }
        path = self.base / f"{name}.json"  # YAML is a superset of JSON
        path.write_text(json.dumps(config))
        return path

    def start(self, timeout: float = 120) -> None:
        client, peer = (f"http://127.0.0.1:{p}" for p in self.etcd_ports)
        self._spawn(
            "etcd",
            ["etcd", "--name", "e", "--data-dir", str(self.base / "etcd")]
            + ["--listen-client-urls", client, "--advertise-client-urls", client]
            + ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
            + ["--initial-cluster", f"e={peer}"],
        )
        for i, name in enumerate(self.names):
            self._spawn(name, [str(PATRONI), str(self._config(name))])
            if i == 0:  # the first bootstraps the cluster; the others join it
                self.wait_for(lambda: self.leader() is not None, "a leader", timeout)
        self.wait_for(
            lambda: (
                sorted(state for _name, _role, state in self.members())
                == ["running"] + ["streaming"] * (len(self.names) - 1)
            ),
            "one running leader and streaming replicas",
            timeout,
        )

    def members(self) -> list[tuple[str, str, str]]:
        """(name, role, state) of each member, as any live member's REST API
        reports them; [] when none answers."""
        for name in self.names:
            if name in self._processes and self._processes[name].poll() is not None:
                continue
            try:
                url = f"http://127.0.0.1:{self.api_ports[name]}/cluster"
                with urllib.request.urlopen(url, timeout=2) as answer:
                    cluster = json.load(answer)
            except OSError:
                continue
            return [(m["name"], m["role"], m["state"]) for m in cluster["members"]]
        return []

    def leader(self) -> str | None:
        for name, role, state in self.members():
            if role == "leader" and state == "running":
                return name
        return None

    def wait_for(self, condition, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-2000:] for p in self.base.glob("*.log")}
                raise TimeoutError(f"timed out waiting for {what}: {self.members()} {logs}")
            time.sleep(0.5)

    def wait_for_steady_sync_standby(self, seconds: float, timeout: float = 120) -> None:
        """Until one member has been the synchronous standby, without a
        change, for ``seconds``."""
        since: list = [None, 0.0]  # the standby, since when

        def steady() -> bool:
            names = [n for n, role, _state in self.members() if role == "sync_standby"]
            current = names[0] if len(names) == 1 else None
            if current != since[0]:
                since[:] = [current, time.monotonic()]
            return current is not None and time.monotonic() - since[1] >= seconds

        self.wait_for(steady, f"a synchronous standby steady for {seconds} s", timeout)

    def kill_node(self, name: str) -> None:
        """SIGKILLs ``name``'s Patroni and postmaster together (Patroni would
        restart a postmaster killed alone, in place)."""
        postmaster = int((self.base / name / "postmaster.pid").read_text().split()[0])
        os.killpg(self._processes[name].pid, signal.SIGKILL)
        os.kill(postmaster, signal.SIGKILL)
        self._processes[name].wait(timeout=30)

    def stop(self) -> None:
        for process in self._processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)
        # Servers whose Patroni died first end once their postmaster is killed.
        for name in self.names:
            pid_file = self.base / name / "postmaster.pid"
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        subprocess.run(["rm", "-rf", str(self.base)], check=False, timeout=60)
