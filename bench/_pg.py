"""A temporary PostgreSQL server for the benchmarks (no pytest needed).

The approach of ``tests/python/_postgres.py``: ``initdb`` into a fresh
directory and ``pg_ctl start`` a server that listens only on a Unix socket in
that directory. ``initdb`` and ``postgres`` refuse to run as root, so as root
the server commands run as Debian's ``postgres`` system user (``runuser``).

Unlike the test server, this one is durable by default (``fsync=on``,
``synchronous_commit=on``): an exporter's cost is mostly its commits, and a
real sink flushes them. ``durable=False`` gives the test server's settings.
The data directory is created under ``parent`` (the benchmark's scratch
directory) so that the server's flushes hit the filesystem being measured,
unless the server user cannot reach it; ``settings()`` says where it is.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

SERVER_USER = "postgres"
_PORT = 5432  # names the socket file only: no TCP


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
    """One throw-away cluster: ``start()`` returns its DSN, ``stop()`` removes it."""

    def __init__(self, bin_dir: Path, parent: Path | None = None, *, durable: bool = True):
        self.bin_dir = bin_dir
        self.durable = durable
        if parent is not None and not _reachable_by_server(parent):
            parent = None  # e.g. under pytest's private tmp: use the system's temp dir
        self.base = Path(tempfile.mkdtemp(prefix="pg-", suffix=".tmp", dir=parent))
        self.data = self.base / "data"
        self.socket_dir = self.base / "socket"
        self.log = self.base / "server.log"
        self.dsn = f"host={self.socket_dir} port={_PORT} user=postgres dbname=postgres"
        self._started = False

    def _command(self, name: str, *args: str) -> list[str]:
        argv = [str(self.bin_dir / name), *args]
        if os.geteuid() == 0:
            return ["runuser", "-u", SERVER_USER, "--", *argv]
        return argv

    def _run(self, name: str, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            self._command(name, *args),
            cwd=self.base,  # runuser keeps the cwd: one the server user may enter
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

    def start(self) -> str:
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
        self._run(
            "initdb",
            *("-D", str(self.data), "--auth=trust", "-U", "postgres", "--no-sync"),
            *("-E", "UTF8", "--locale=C"),
        )
        durability = "on" if self.durable else "off"
        options = (
            f"-k {self.socket_dir} -p {_PORT} -c listen_addresses='' "
            f"-c fsync={durability} -c synchronous_commit={durability} "
            f"-c full_page_writes={durability} -c max_connections=100"
        )
        self._run(
            "pg_ctl",
            *("-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60"),
            "start",
        )
        self._started = True
        return self.dsn

    def stop(self) -> None:
        try:
            if self._started:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
                self._started = False
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def settings(self) -> dict:
        """What the report should say about the server."""
        return {
            "bin": str(self.bin_dir),
            "fsync": self.durable,
            "synchronous_commit": self.durable,
            "unix_socket": True,
            "data_directory": str(self.data),
        }


@contextlib.contextmanager
def temporary_postgres(
    parent: Path | None = None, *, durable: bool = True
) -> Iterator[TemporaryPostgres]:
    """A started server, stopped and removed on exit. Raises RuntimeError when
    PostgreSQL is not installed."""
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        raise RuntimeError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): "
            "run scripts/bootstrap.sh"
        )
    server = TemporaryPostgres(bin_dir, parent, durable=durable)
    try:
        server.start()
        yield server
    finally:
        server.stop()
