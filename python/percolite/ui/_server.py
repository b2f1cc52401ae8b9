"""The console's HTTP server: the page, its static files and the JSON API.

Built on the standard library's ``http.server`` (a threading server): a
console for one store serves one operator's browser, a few requests a
second, so nothing more is needed, and a plain ``pip install percolite``
carries no web framework.

Security, as a notebook server does it:

* it listens on 127.0.0.1 unless told otherwise;
* every request needs the access token: ``?token=`` in the URL (the URL
  printed at start), the ``percolite_console`` cookie (HttpOnly,
  SameSite=Strict) set from it, or the ``X-Percolite-Token`` header; a
  wrong or missing one gets 403;
* a request whose Host header does not name the address the server listens
  on gets 403 (a page of another site that rebinds its DNS name to this
  address cannot read the console);
* actions are POSTs that need the token in the header (a cookie alone does
  not do: another site's page cannot set the header) and, when the browser
  sends one, an Origin of the console itself;
* the Content-Security-Policy lets the page load scripts, styles, images and
  data only from the console itself, and the page fetches nothing else.
"""

from __future__ import annotations

import errno
import hmac
import http.cookies
import ipaddress
import json
import logging
import secrets
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from ..errors import Error
from . import _graph
from ._data import SAMPLE_SECONDS, Monitor

__all__ = ["Console", "DEFAULT_HOST", "DEFAULT_PORT"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
COOKIE = "percolite_console"
TOKEN_HEADER = "X-Percolite-Token"
_MAX_BODY = 64 * 1024

log = logging.getLogger("percolite.ui")

_STATIC = {
    "/static/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/static/console.css": ("console.css", "text/css; charset=utf-8"),
}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'self' http://localhost:* http://127.0.0.1:*"
)


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Console:
    """A live console for ``env``'s store, served over HTTP.

    ``host`` and ``port`` say where it listens (``port=0`` picks a free one;
    :attr:`url` tells which, with the token); ``token`` is the access token
    (a random one when None). :meth:`start` serves from a daemon thread,
    :meth:`serve_forever` from the calling one; :meth:`close` stops it. The
    console reads the store only through ``env`` and never closes it.

    Raises ValueError naming the problem when the host is not an address of
    this machine or the port cannot be bound (in use, privileged)."""

    def __init__(
        self,
        env: Any,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        sample_seconds: float = SAMPLE_SECONDS,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be a number from 0 to 65535, not {port!r}")
        if not isinstance(host, str) or not host:
            raise ValueError(f"host must be an address to listen on, not {host!r}")
        if token is not None and (not isinstance(token, str) or len(token) < 16):
            raise ValueError("token must be a str of at least 16 characters")
        self.env = env
        self.host = host
        self.token: str = token if token is not None else secrets.token_urlsafe(24)
        self.monitor: Monitor = Monitor(env, sample_seconds=sample_seconds)
        self._server = _bind(host, port, self)
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._looping = threading.Event()
        self._serving_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The address to open, with the token in it (listening on every
        address, the machine's name)."""
        host = self.host
        if _unspecified(host):
            host = socket.gethostname()
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/?token={self.token}"

    def start(self) -> Console:
        """Serves from a daemon thread; returns the console. ``with
        Console(env) as console:`` starts it too, and closes it at the end."""
        self._begin()
        self._thread = threading.Thread(
            target=self._loop, name="percolite-console-http", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serves on this thread until :meth:`close` (or KeyboardInterrupt)."""
        self._begin()
        try:
            self._loop()
        finally:
            self.monitor.stop()

    def _loop(self) -> None:
        # Whoever closes the console from another thread must stop this loop
        # (shutdown), but only while it runs: shutdown waits for a loop that
        # an interrupt before it began would never run.
        self._serving_thread = threading.current_thread()
        self._looping.set()
        try:
            self._server.serve_forever()
        finally:
            self._looping.clear()

    def _loop_thread(self) -> threading.Thread | None:
        return self._serving_thread

    def _begin(self) -> None:
        if self._closed:
            raise RuntimeError("the console is closed: make a new one")
        if self._started:
            raise RuntimeError("the console is already serving")
        self._started = True
        self.monitor.start()

    def close(self) -> None:
        """Stops serving and sampling; idempotent. The store stays open."""
        if self._closed:
            return
        self._closed = True
        if self._looping.is_set() and self._loop_thread() is not threading.current_thread():
            self._server.shutdown()
        self._server.server_close()
        self.monitor.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Console:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<percolite.ui.Console {self.host}:{self.port} for {self.env.path!r}>"

    # -- what the handler asks ----------------------------------------------
    def allowed_hosts(self) -> set[str]:
        """The Host header values that name this server."""
        port = self.port
        names = {self.host}
        try:
            address = ipaddress.ip_address(self.host)
        except ValueError:
            address = None
        if address is not None and (address.is_loopback or address.is_unspecified):
            names |= {"localhost", "127.0.0.1", "::1"}
        if address is not None and address.is_unspecified:
            names |= {socket.gethostname(), socket.getfqdn()}
        allowed = set()
        for name in names:
            shown = f"[{name}]" if ":" in name else name
            allowed |= {f"{shown}:{port}".lower()}
            if port == 80:
                allowed.add(shown.lower())
        return allowed


def _bind(host: str, port: int, console: Console) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"console": console})
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
    try:
        server = server_class((host, port), handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} on {host} is already in use") from None
        if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            raise ValueError(f"host {host!r} is not an address of this machine") from None
        if e.errno == errno.EACCES:
            raise ValueError(f"port {port} needs privileges to listen on") from None
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"host {host!r} is not an address of this machine ({e})") from None
    server.daemon_threads = True
    return server


class _Handler(BaseHTTPRequestHandler):
    console: Console
    server_version = "percolite-console"
    protocol_version = "HTTP/1.1"

    # -- plumbing -----------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the protocol's name
        log.debug("console request: " + format, *args)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", _CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data, default=_jsonable).encode()
        self._send(status, body, "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _names_this_console(self, host: str) -> bool:
        """Whether ``host`` (``name:port``) is an address this console listens on."""
        if host in self.console.allowed_hosts():
            return True
        # Listening on every address: any IP of the machine (DNS rebinding needs a name).
        return _unspecified(self.console.host) and _ip_literal_with_port(host, self.console.port)

    def _check_host(self) -> None:
        host = (self.headers.get("Host") or "").strip().lower()
        if not self._names_this_console(host):
            raise _Refused(403, f"Host {host!r} does not name this console")

    def _presented_tokens(self, query: dict[str, list[str]]) -> dict[str, str]:
        found = {}
        header = self.headers.get(TOKEN_HEADER)
        if header:
            found["header"] = header
        if query.get("token"):
            found["query"] = query["token"][0]
        cookies = http.cookies.SimpleCookie()
        try:
            cookies.load(self.headers.get("Cookie") or "")
        except http.cookies.CookieError:
            pass
        if COOKIE in cookies:
            found["cookie"] = cookies[COOKIE].value
        return found

    def _valid(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(
            token.encode(), self.console.token.encode()
        )

    def _route(self) -> tuple[str, dict[str, list[str]]]:
        parsed = urllib.parse.urlsplit(self.path)
        return parsed.path, urllib.parse.parse_qs(parsed.query, keep_blank_values=True)

    # -- GET ----------------------------------------------------------------
    def do_HEAD(self) -> None:  # noqa: N802 - the protocol's name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - the protocol's name
        self._answer(503, self._serve_get)  # a store error: it is closing

    def _serve_get(self) -> None:
        path, query = self._route()
        tokens = self._presented_tokens(query)
        if not any(self._valid(t) for t in tokens.values()):
            raise _Refused(403, "a valid token is needed: open the URL the console printed")
        extra = {}
        if self._valid(tokens.get("query")) and not self._valid(tokens.get("cookie")):
            extra["Set-Cookie"] = (
                f"{COOKIE}={self.console.token}; HttpOnly; SameSite=Strict; Path=/"
            )
        self._get(path, query, extra)

    def _answer(self, store_error: int, serve: Any) -> None:
        """Checks the Host, runs ``serve``, and answers what went wrong as
        JSON: a refusal with its status, bad input 400, a store's refusal
        ``store_error``; a client that went away, nothing."""
        try:
            self._check_host()
            serve()
        except _Refused as e:
            self._error(e.status, str(e))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except (ValueError, TypeError) as e:
            self._error(400, str(e))
        except Error as e:
            self._error(store_error, f"{type(e).__name__}: {e}")

    def _get(self, path: str, query: dict[str, list[str]], extra: dict[str, str]) -> None:
        monitor = self.console.monitor

        def arg(name: str) -> str | None:
            values = query.get(name)
            return values[0] if values else None

        def number(name: str, default: int) -> int:
            text = arg(name)
            if text is None:
                return default
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"{name} must be a whole number, not {text!r}") from None

        if path in ("/", "/index.html"):
            page = _static("index.html").decode()
            page = page.replace("{{token}}", self.console.token)
            self._send(200, page.encode(), "text/html; charset=utf-8", extra)
        elif path in _STATIC:
            name, kind = _STATIC[path]
            self._send(200, _static(name), kind, extra)
        elif path == "/api/status":
            self._json(200, monitor.status())
        elif path == "/api/history":
            self._json(200, monitor.history())
        elif path == "/api/graph":
            self._json(200, monitor.graph())
        elif path == "/api/graph.svg":
            self._send(200, _graph.svg(monitor.graph()).encode(), "image/svg+xml", extra)
        elif path == "/api/failures":
            self._json(200, monitor.failures())
        elif path == "/api/parked":
            limit = number("limit", 200)
            work = monitor.work(arg("status") or "parked", arg("observer"), arg("queue"), limit)
            self._json(200, work)
        elif path == "/api/cells":
            self._json(
                200,
                monitor.cells(
                    prefix=arg("prefix"),
                    start=arg("start"),
                    end=arg("end"),
                    after=arg("after"),
                    limit=number("limit", 50),
                    form=arg("form") or "text",
                    queue=arg("queue"),
                ),
            )
        elif path in _ACTIONS:
            self._error(405, f"{path} is an action: POST it (with the token in {TOKEN_HEADER})")
        elif path == "/api/metrics":
            from .._metrics import prometheus_text

            body = prometheus_text(monitor.sample()).encode()
            self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._error(404, f"nothing at {path}")

    def _not_allowed(self) -> None:
        self._error(405, f"{self.command} is not served here: GET reads, POST acts")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815 - the protocol's names

    # -- POST: actions --------------------------------------------------------
    def do_POST(self) -> None:  # noqa: N802 - the protocol's name
        self._answer(409, self._serve_post)  # a store error: the action was refused

    def _serve_post(self) -> None:
        path, _query = self._route()
        if not self._valid(self.headers.get(TOKEN_HEADER)):
            raise _Refused(403, f"an action needs the token in the {TOKEN_HEADER} header")
        origin = self.headers.get("Origin")
        if origin is not None and not self._names_this_console(
            urllib.parse.urlsplit(origin).netloc.lower()
        ):
            raise _Refused(403, f"Origin {origin!r} is not this console")
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            raise _Refused(413, f"the request body is larger than {_MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise ValueError("the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        self._json(200, self._act(path, body))

    def _act(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        monitor = self.console.monitor
        who = self.client_address[0]
        fields = _ACTIONS.get(path)
        if fields is None:
            raise _Refused(404, f"no action at {path}")
        unknown = sorted(set(body) - set(fields))
        if unknown:
            raise ValueError(
                f"{path} takes {', '.join(fields) or 'nothing'}, not {', '.join(unknown)}"
            )
        if path == "/api/retry":
            for name in ("observer", "queue", "item"):
                if body.get(name) is not None and not isinstance(body[name], str):
                    raise TypeError(f"{name} must be a string")
            if len([n for n in ("observer", "queue", "item") if body.get(n) is not None]) > 1:
                raise ValueError("retry takes one of observer, queue or item, or none for all")
            done = monitor.retry(
                observer=body.get("observer"), queue=body.get("queue"), item=body.get("item")
            )
            log.info("console (%s): retried %d parked (%s)", who, done["retried"], done["what"])
            return done
        if path == "/api/take-over":
            queue = body.get("queue")
            if not isinstance(queue, str):
                raise TypeError("queue must be the export queue's id (a string)")
            done = monitor.take_over(queue)
            log.info("console (%s): took over the sink of export queue %r: %s", who, queue, done)
            return done
        raise _Refused(404, f"no action at {path}")  # pragma: no cover - _ACTIONS lists them


# The actions, and the fields each takes.
_ACTIONS = {"/api/retry": ("observer", "queue", "item"), "/api/take-over": ("queue",)}


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _ip_literal_with_port(host: str, port: int) -> bool:
    """Whether a Host header is an IP address (not a name) and ``port``."""
    name, _, given = host.rpartition(":")
    if given != str(port):
        return False
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def name_the_option(message: str, option: str) -> str:
    """A Console's complaint about its port, naming the command-line option
    that gave it: "port 80 on ..." becomes "--port 80 on ..."."""
    return option + message[len("port") :] if message.startswith("port ") else message


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
