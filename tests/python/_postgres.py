"""A real, temporary PostgreSQL server for the tests: never a mock.

``TemporaryPostgres`` runs ``initdb`` into a fresh directory and starts the
server with ``pg_ctl``, listening only on a Unix socket in that directory (no
TCP, so the port number only names the socket file and cannot clash with
another server). ``stop()`` stops it and removes the directory.

The binaries come from Debian's packages (``/usr/lib/postgresql/<version>/bin``;
``scripts/bootstrap.sh`` installs them). ``initdb`` and ``postgres`` refuse to
run as root, so when the tests run as root (as in CI) the server commands run
as Debian's ``postgres`` system user through ``runuser``, with the directory
handed over to that user.

Run as a script, ``python tests/python/_postgres.py COMMAND ...`` runs COMMAND
with a temporary server, its URI in ``PERCOLITE_TEST_POSTGRES`` (:func:`main`).

The session fixture ``postgres_dsn`` starts one server for the whole test run
and fails (it does not skip) when PostgreSQL is missing. The benchmarks
(``bench/bench_export.py``) use :func:`temporary_postgres` from here too, with
``durable=True``: an exporter's cost there is mostly its commits.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _isolated import alive, children_of

__all__ = [
    "TemporaryPostgres",
    "both_servers",
    "find_postgres_bin",
    "postgres_dsn",
    "postgres_server",
    "primary_and_standby",
    "temporary_postgres",
]

ENV_VARIABLE = "PERCOLITE_TEST_POSTGRES"  # a postgresql:// URI: the server the tests use

SERVER_USER = "postgres"  # created by Debian's postgresql package
_PORT = 5432  # names the socket file only: the server listens on no TCP address


def find_postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` holding ``initdb``, else the
    directory of an ``initdb`` on PATH, else None."""

    def version(path: str) -> tuple:
        name = Path(path).parents[1].name
        return tuple(int(part) for part in name.split(".") if part.isdigit())

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _reachable_by_server(directory: Path) -> bool:
    """Whether the server user can enter ``directory`` (as root, the server
    runs as another user: every ancestor must be searchable by others)."""
    if os.geteuid() != 0:
        return True
    path = directory.resolve()
    return all(part.stat().st_mode & 0o001 for part in (path, *path.parents))


class TemporaryPostgres:
    """One throw-away cluster: ``start()`` returns its DSN, ``stop()`` removes it.

    ``parent``: where to create its directory (the system's temp dir when
    omitted, or when the server user could not enter it). ``durable``: run
    with fsync and synchronous commits (off for tests: a test server that dies
    takes nothing of value with it)."""

    def __init__(
        self,
        bin_dir: Path,
        parent: Path | None = None,
        *,
        durable: bool = False,
        password: str | None = None,
        synchronous_standby: bool = False,
        tcp: tuple[str, str] | None = None,
    ):
        self.bin_dir = bin_dir
        # (address, network): also listen on TCP at address, port 5432, and
        # trust clients from network (a CIDR).
        self.tcp = tcp
        self.durable = durable
        # Commits wait for a standby's flush (any standby: '*'), as on a
        # primary that must not lose a commit it reported in a failover.
        self.synchronous_standby = synchronous_standby
        if parent is not None and not _reachable_by_server(parent):
            parent = None  # e.g. under pytest's private tmp: use the system's temp dir
        self.base = Path(tempfile.mkdtemp(prefix="percolite-pg-", dir=parent))
        self.data = self.base / "data"
        self.socket_dir = self.base / "socket"
        self.port = _PORT  # of the socket file
        self.log = self.base / "server.log"
        # With a password, the server asks for it (SCRAM) instead of trusting.
        self.password = password
        self.dsn = f"host={self.socket_dir} port={_PORT} user=postgres dbname=postgres"
        # The same server as a URI (what percolite.open takes for a store on it).
        self.uri = f"postgresql://postgres@/postgres?host={self.socket_dir}&port={_PORT}"
        self._started = False

    def _command(self, name: str, *args: str) -> list:
        argv = [str(self.bin_dir / name), *args]
        if os.geteuid() == 0:
            return ["runuser", "-u", SERVER_USER, "--", *argv]
        return argv

    def _run(self, name: str, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            self._command(name, *args),
            cwd=self.base,  # runuser keeps the cwd: make it one the server user may enter
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(
                f"{name} {' '.join(args)} failed with status {result.returncode}\n"
                f"{result.stdout}{result.stderr}{log}"
            )

    def _prepare_directories(self) -> None:
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise RuntimeError(
                    f"running as root needs the {SERVER_USER!r} system user, which "
                    "Debian's postgresql package creates: run scripts/bootstrap.sh"
                ) from None
            for path in (self.base, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
            os.chmod(self.base, 0o755)  # mkdtemp's 0o700 would keep the server user out

    def start(self) -> str:
        self._prepare_directories()
        auth = ["--auth=trust"]
        if self.password is not None:
            pwfile = self.base / "password"
            pwfile.write_text(self.password + "\n")
            if os.geteuid() == 0:
                user = pwd.getpwnam(SERVER_USER)
                os.chown(pwfile, user.pw_uid, user.pw_gid)
            auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
        self._run(
            "initdb",
            "-D",
            str(self.data),
            *auth,
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        if self.tcp is not None:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {self.tcp[1]} trust\n")
        self._start_server()
        return self.dsn

    def _start_server(self) -> None:
        durability = "on" if self.durable else "off"
        commits = "on" if self.durable or self.synchronous_standby else "off"
        options = (
            f"-k {self.socket_dir} -p {_PORT} "
            f"-c listen_addresses='{self.tcp[0] if self.tcp else ''}' "
            f"-c fsync={durability} -c synchronous_commit={commits} "
            f"-c full_page_writes={durability} -c max_connections=100"
        )
        if self.synchronous_standby:
            options += " -c synchronous_standby_names='*'"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self._started = True

    def make_standby(self, tcp: tuple[str, str] | None = None) -> TemporaryPostgres:
        """A streaming standby of this server, started: ``pg_basebackup -R``
        into a directory of its own, with its own socket (and TCP as ``tcp``
        says, as for the constructor). ``promote()`` makes it the primary
        (one with no standby of its own: its commits wait for nobody)."""
        standby = TemporaryPostgres(self.bin_dir, self.base.parent, durable=self.durable, tcp=tcp)
        standby._prepare_directories()
        standby._run(
            "pg_basebackup",
            "-D",
            str(standby.data),
            "-R",  # standby.signal and primary_conninfo: a streaming standby
            "-X",
            "stream",
            "--no-sync",
            "-h",
            str(self.socket_dir),
            "-p",
            str(_PORT),
            "-U",
            "postgres",
        )
        standby._start_server()
        return standby

    def promote(self) -> None:
        """``pg_ctl promote``: the standby becomes a primary (waits until it is)."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def kill(self) -> None:
        """SIGKILLs the postmaster, as when its machine dies: no shutdown,
        no goodbye to clients or standbys (the backends notice they lost
        their postmaster and end). The directory stays until :meth:`stop`."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        backends = children_of(pid)
        os.kill(pid, signal.SIGKILL)
        self._started = False
        # The orphaned backends notice their postmaster is gone and end;
        # wait for them so that stop() does not remove files under them.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(alive, [pid, *backends])):
            time.sleep(0.02)

    def pause(self) -> None:
        """``pg_ctl stop -m fast``, keeping the data: the server is down
        (connections cut, new ones refused) until :meth:`resume`."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        self._started = False

    def resume(self) -> None:
        """Starts the server :meth:`pause` stopped, with the same settings."""
        self._start_server()

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the server
        comes back with the same settings."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-m",
            "fast",
            "-w",
            "-t",
            "60",
            "restart",
        )

    def stop(self) -> None:
        try:
            if self._started:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
                self._started = False
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def settings(self) -> dict:
        """What a benchmark report should say about the server."""
        return {
            "bin": str(self.bin_dir),
            "fsync": self.durable,
            "synchronous_commit": self.durable,
            "unix_socket": True,
            "data_directory": str(self.data),
        }


_NOT_INSTALLED = (
    "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run scripts/bootstrap.sh"
)


@contextlib.contextmanager
def temporary_postgres(
    parent: Path | None = None,
    *,
    durable: bool = False,
    password: str | None = None,
    synchronous_standby: bool = False,
    tcp: tuple[str, str] | None = None,
) -> Iterator[TemporaryPostgres]:
    """A started server, stopped and removed on exit. Raises RuntimeError when
    PostgreSQL is not installed."""
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        raise RuntimeError(_NOT_INSTALLED)
    server = TemporaryPostgres(
        bin_dir,
        parent,
        durable=durable,
        password=password,
        synchronous_standby=synchronous_standby,
        tcp=tcp,
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server started for this test session (superuser
    ``postgres``, database ``postgres``, trust authentication over a Unix
    socket): its ``dsn`` and ``uri``. Fails every test that uses it when
    PostgreSQL is missing."""
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        pytest.fail(_NOT_INSTALLED, pytrace=False)
    server = TemporaryPostgres(bin_dir)
    try:
        server.start()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        server.stop()
        pytest.fail(f"could not start a temporary PostgreSQL server: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def primary_and_standby(tmp_path):
    """A primary whose commits wait for its streaming standby, and that
    standby, started for one test: ``(primary, standby)``. ``primary.kill()``
    and ``standby.promote()`` make a failover."""
    with temporary_postgres(tmp_path, synchronous_standby=True) as primary:
        standby = primary.make_standby()
        try:
            yield primary, standby
        finally:
            standby.stop()


def both_servers(primary: TemporaryPostgres, standby: TemporaryPostgres, extra: str = "") -> str:
    """The URI naming both servers; libpq picks the one that takes writes."""
    return (
        f"postgresql://postgres@/postgres?host={primary.socket_dir},{standby.socket_dir}"
        f"&port={_PORT},{_PORT}&target_session_attrs=read-write{extra}"
    )


@pytest.fixture(scope="session")
def postgres_dsn(postgres_server):
    """The DSN (key=value form) of the session's server (``postgres_server``)."""
    return postgres_server.dsn


def main(argv: list[str]) -> int:
    """``python tests/python/_postgres.py COMMAND ...``: runs COMMAND with a
    temporary server, its URI in ``PERCOLITE_TEST_POSTGRES`` (the C++ tests
    run the postgresql backend's conformance tests against it); a server
    already given there is used as it is."""
    if not argv:
        print("usage: _postgres.py COMMAND [ARG ...]", file=sys.stderr)
        return 2
    if os.environ.get(ENV_VARIABLE):
        return subprocess.call(argv)
    with temporary_postgres() as server:
        return subprocess.call(argv, env={**os.environ, ENV_VARIABLE: server.uri})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
