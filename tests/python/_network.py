"""Machines on one machine, for the tests: network namespaces joined to this
one by veth pairs, links the tests cut and delay.

``Link`` makes a namespace (``ip netns``) with one end of a veth pair in it,
``10.231.<n>.2``, and the other end here, ``10.231.<n>.1`` (and ``.3``, for
a second server): a process run
with ``link.command(...)`` reaches a server that listens on ``link.here``
over a real TCP link, as from another machine, and nothing else (the
namespace has no other route). ``cut()`` drops every packet in and out of
the namespace (nftables, in the namespace: 100% loss, no reset, no error,
as a pulled cable or a partition looks to TCP), ``restore()`` ends that.

``DelayProxy`` forwards TCP connections to a server, delaying each chunk by
a fixed time in each direction (this kernel has no ``netem``): the link of
a group that is only slow.

Everything needs root (``ip netns``, nftables): as in CI. The addresses are
on this machine's veths only, never sent anywhere else.
"""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import subprocess
import threading
import time
from collections import deque

__all__ = ["DelayProxy", "Link", "need_network_tools"]

_SUBNET = "10.231"
_PREFIX = f"{_SUBNET}.0.0/16"  # what a server's pg_hba.conf lets in


def need_network_tools() -> None:
    """Raises RuntimeError naming what is missing to build links here."""
    if os.geteuid() != 0:
        raise RuntimeError("network namespaces need root (CI runs the tests as root)")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing: run scripts/bootstrap.sh (Debian's {package})")


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")


class Link:
    """A namespace joined to this one by a veth pair (see the module)."""

    subnet = _PREFIX

    def __init__(self, index: int) -> None:
        if not 1 <= index <= 254:
            raise ValueError(f"index must be in 1..254, not {index}")
        need_network_tools()
        tag = f"{os.getpid() % 100000}x{index}"
        self.namespace = f"pl{tag}"
        self._veth = f"plv{tag}"  # here
        self._peer = f"plp{tag}"  # its other end, in the namespace
        self.here = f"{_SUBNET}.{index}.1"  # this side's address
        self.here_too = f"{_SUBNET}.{index}.3"  # another (a second server's)
        self.there = f"{_SUBNET}.{index}.2"  # the namespace's address
        self._cut = False
        _run("ip", "netns", "add", self.namespace)
        try:
            _run("ip", "link", "add", self._veth, "type", "veth", "peer", "name", self._peer)
            _run("ip", "link", "set", self._peer, "netns", self.namespace)
            _run("ip", "addr", "add", f"{self.here}/24", "dev", self._veth)
            _run("ip", "addr", "add", f"{self.here_too}/24", "dev", self._veth)
            _run("ip", "link", "set", self._veth, "up")
            inside = ("ip", "netns", "exec", self.namespace)
            _run(*inside, "ip", "addr", "add", f"{self.there}/24", "dev", self._peer)
            _run(*inside, "ip", "link", "set", self._peer, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def cut(self) -> None:
        """Every packet in or out of the namespace dropped, silently."""
        rules = (
            "table inet percolite_cut {\n"
            "  chain in { type filter hook input priority 0; policy drop; }\n"
            "  chain out { type filter hook output priority 0; policy drop; }\n"
            "}\n"
        )
        subprocess.run(
            self.command(["nft", "-f", "-"]),
            input=rules,
            text=True,
            check=True,
            capture_output=True,
            timeout=30,
        )
        self._cut = True

    def restore(self) -> None:
        """Ends :meth:`cut`: packets flow again (connections that TCP has
        not given up on yet carry on)."""
        _run(*self.command(["nft", "delete", "table", "inet", "percolite_cut"]))
        self._cut = False

    def close(self) -> None:
        """Removes the namespace (and with it both ends of the veth pair)."""
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self._veth], capture_output=True, timeout=30)


class DelayProxy:
    """Listens on ``(host, port)`` (port 0: any free one, see ``.port``) and
    forwards each connection to ``target``, every chunk delayed by ``delay``
    seconds in each direction (so a round trip takes ``2 * delay`` more),
    order kept. ``close()`` stops it and drops its connections."""

    def __init__(self, host: str, target: tuple[str, int], delay: float, port: int = 0) -> None:
        self.delay = delay
        self._target = target
        self._listener = socket.create_server((host, port))
        self.host, self.port = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="delay-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(None)
            self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(source, sink), name="delay-pump", daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Reads ``source``, sends each chunk to ``sink`` once it is
        ``delay`` old; ends both when either side closes."""
        pending: deque[tuple[float, bytes]] = deque()
        selector = selectors.DefaultSelector()
        selector.register(source, selectors.EVENT_READ)
        open_ = True
        try:
            while not self._closed.is_set() and (open_ or pending):
                now = time.monotonic()
                while pending and pending[0][0] <= now:
                    sink.sendall(pending.popleft()[1])
                timeout = (pending[0][0] - now) if pending else 0.2
                if open_ and selector.select(max(0.0, min(timeout, 0.2))):
                    chunk = source.recv(65536)
                    if chunk:
                        pending.append((time.monotonic() + self.delay, chunk))
                    else:
                        open_ = False
                elif pending:
                    time.sleep(max(0.0, min(pending[0][0] - time.monotonic(), 0.2)))
        except OSError:
            pass
        finally:
            selector.close()
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass
        self._thread.join(timeout=5)
