"""Where webindex's pages come from: directories of HTML files, link
records (JSON lines) and WARC files.

Each source yields :class:`Page` values, in a deterministic order, and
reports what it skips to an ``on_problem`` callback as a :class:`Problem`:
bad input never stops a run.

* A **directory** of HTML files (``.html``, ``.htm``, ``.xhtml``): a file's
  URL is the base URL (given a trailing ``/``) followed by its path relative
  to the directory it was found under, normalized (``links.normalize``).
  With ``http://`` as the base, a tree whose top directories are host names
  (as ``wget --mirror`` writes it) gets its hosts' URLs. Other files are
  counted as not HTML.
* **Link records**: a file of JSON lines (``.jsonl``, ``.json``, ``.wat``,
  optionally ``.gz``), one object per page: ``{"url": URL, "links": [{"url":
  HREF, "text": ANCHOR}, ...], "base": BASE}`` (``base`` optional), or a WAT
  record as Common Crawl publishes them (``Envelope.WARC-Header-Metadata.
  WARC-Target-URI`` and the ``A@/href`` entries of ``...HTML-Metadata.
  Links``). Links are resolved by the same rules as HTML's.
* **WARC** files (``.warc``, ``.warc.gz``): response records whose content
  type is HTML, read with ``warcio`` (the optional extra
  ``percolite[webindex]``).
"""

from __future__ import annotations

import enum
import gzip
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from .links import Links, decode_page, extract_links, normalize, resolve_links

__all__ = [
    "Page",
    "Problem",
    "ProblemKind",
    "HTML_SUFFIXES",
    "directory_pages",
    "record_pages",
    "warc_pages",
    "pages_of",
    "file_url",
]

HTML_SUFFIXES = (".html", ".htm", ".xhtml")
RECORD_SUFFIXES = (".jsonl", ".json", ".wat", ".jsonl.gz", ".json.gz", ".wat.gz")
WARC_SUFFIXES = (".warc", ".warc.gz")


class Page(NamedTuple):
    """One page: its URL (normalized), its outlinks ``{target: anchor}``,
    and, for a file of a directory, the file's absolute path and the digest
    of its bytes (the change detection between runs). ``unchanged``: a file
    loaded before with this URL and digest, not parsed again (its links are
    left empty)."""

    url: str
    links: dict[str, str]
    file: str | None = None
    digest: str | None = None
    unchanged: bool = False


class ProblemKind(enum.Enum):
    MISSING_PATH = "missing path"  # a PATH given does not exist
    UNREADABLE = "unreadable"  # opening, listing or reading failed (OSError)
    NOT_HTML = "not HTML"  # a file without an HTML suffix, or with NUL bytes
    REPLACED = "decoded with replacement"  # loaded, with undecodable bytes replaced
    BAD_HREF = "bad href"  # an href that does not parse (the page is loaded)
    BAD_RECORD = "bad record"  # a link record that is not a JSON object with a URL
    NOT_RESPONSE = "not a response"  # a WARC record that is not an HTML response
    BAD_URL = "bad page URL"  # a page whose own URL is not http(s) or does not parse
    NO_WARCIO = "warcio missing"  # a WARC file, and warcio is not installed


class Problem(NamedTuple):
    location: str
    kind: ProblemKind
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}"


OnProblem = Callable[[Problem], None]


def _ignore(problem: Problem) -> None:
    pass


def file_url(base_url: str, relative: str) -> str | None:
    """The URL of the file at ``relative`` (a path with ``/``) under a
    directory loaded with ``base_url``; None when it is not http(s)."""
    if not base_url.endswith("/"):
        base_url += "/"
    return normalize(base_url + relative)


# A file name that file_url appends to its directory's URL unchanged.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._~-]+\Z").match


def _directory_url(base_url: str, inside: str) -> str | None:
    """The URL of the directory at ``inside`` (a relative path ending in
    ``/``, or empty for the top), to which :func:`file_url` of a file with a
    plain name (``_PLAIN_NAME``) is that name appended: normalizing once per
    directory instead of per file. None when its files need
    :func:`file_url` one by one."""
    if "?" in base_url + inside or "#" in base_url + inside:
        return None
    try:
        url = file_url(base_url, inside)
    except ValueError:
        return None
    return url if url is not None and url.endswith("/") else None


def _bad_hrefs(location: str, links: Links, on_problem: OnProblem) -> None:
    if links.bad_hrefs:
        on_problem(
            Problem(location, ProblemKind.BAD_HREF, f"{links.bad_hrefs} href(s) did not parse")
        )


def directory_pages(
    directory: str,
    base_url: str,
    on_problem: OnProblem = _ignore,
    known: Mapping[str, tuple[str, str]] | None = None,
) -> Iterator[Page]:
    """The HTML files under ``directory`` (symbolic links to directories not
    followed), sorted by path. A file that ``known`` (absolute path ->
    ``(url, digest)`` of the files loaded before) has with the same URL and
    digest is hashed but not parsed: it comes as an ``unchanged`` page."""
    top = os.path.abspath(directory)

    def walk_error(e: OSError) -> None:
        on_problem(Problem(e.filename or top, ProblemKind.UNREADABLE, e.strerror or str(e)))

    for root, dirs, files in os.walk(top, onerror=walk_error):
        dirs.sort()
        inside = os.path.relpath(root, top).replace(os.sep, "/")
        inside = "" if inside == "." else inside + "/"
        directory_url = _directory_url(base_url, inside)
        for name in sorted(files):
            path = os.path.join(root, name)
            if not name.lower().endswith(HTML_SUFFIXES):
                on_problem(Problem(path, ProblemKind.NOT_HTML, "not an HTML file name"))
                continue
            try:
                if directory_url is not None and _PLAIN_NAME(name):
                    url: str | None = directory_url + name
                else:
                    url = file_url(base_url, inside + name)
            except ValueError as e:
                url, why = None, str(e)
            else:
                why = f"not an http(s) URL: {base_url}"
            if url is None:
                on_problem(Problem(path, ProblemKind.BAD_URL, why))
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                on_problem(Problem(path, ProblemKind.UNREADABLE, e.strerror or str(e)))
                continue
            digest = hashlib.sha256(data).hexdigest()
            if known is not None and known.get(path) == (url, digest):
                yield Page(url, {}, path, digest, unchanged=True)
                continue
            page = _html_page(path, url, data, None, on_problem)
            if page is not None:
                yield Page(page.url, page.links, path, digest)


def _html_page(
    location: str, url: str, data: bytes, content_type: str | None, on_problem: OnProblem
) -> Page | None:
    if b"\0" in data[:8192]:
        on_problem(Problem(location, ProblemKind.NOT_HTML, "binary content (NUL bytes)"))
        return None
    text, replaced = decode_page(data, content_type)
    if replaced:
        on_problem(Problem(location, ProblemKind.REPLACED, "bytes not in its charset replaced"))
    links = extract_links(url, text)
    _bad_hrefs(location, links, on_problem)
    return Page(url, links.links)


def _open_text(path: str) -> Any:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def _record_fields(record: Any) -> tuple[Any, Any, Any]:
    """(url, links, base) of a flat link record or a WAT record."""
    envelope = record.get("Envelope")
    if not isinstance(envelope, dict):
        return record.get("url"), record.get("links", []), record.get("base")
    url = (envelope.get("WARC-Header-Metadata") or {}).get("WARC-Target-URI")
    html = (
        ((envelope.get("Payload-Metadata") or {}).get("HTTP-Response-Metadata") or {}).get(
            "HTML-Metadata"
        )
    ) or {}
    links = [link for link in html.get("Links") or [] if link.get("path") == "A@/href"]
    return url, links, (html.get("Head") or {}).get("Base")


def record_pages(path: str, on_problem: OnProblem = _ignore) -> Iterator[Page]:
    """The pages of a file of link records, in file order."""
    try:
        f = _open_text(path)
    except OSError as e:
        on_problem(Problem(path, ProblemKind.UNREADABLE, e.strerror or str(e)))
        return
    with f:
        try:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                location = f"{path}:{number}"
                try:
                    record = json.loads(line)
                    url, links, base = _record_fields(record)
                    page_url = normalize(url)
                    if page_url is None:
                        raise ValueError(f"not an http(s) URL: {url!r}")
                    hrefs = [(link["url"], link.get("text") or "") for link in links]
                    if not all(isinstance(h, str) and isinstance(t, str) for h, t in hrefs):
                        raise ValueError("a link's url or text is not a string")
                    if base is not None and not isinstance(base, str):
                        raise ValueError("base is not a string")
                except (ValueError, TypeError, KeyError, AttributeError) as e:
                    on_problem(Problem(location, ProblemKind.BAD_RECORD, str(e) or repr(e)))
                    continue
                resolved = resolve_links(page_url, hrefs, base)
                _bad_hrefs(location, resolved, on_problem)
                yield Page(page_url, resolved.links)
        except (OSError, EOFError) as e:
            on_problem(Problem(path, ProblemKind.UNREADABLE, str(e)))


def warc_pages(path: str, on_problem: OnProblem = _ignore) -> Iterator[Page]:
    """The HTML response records of a WARC file, in file order."""
    try:
        from warcio.archiveiterator import ArchiveIterator
        from warcio.exceptions import ArchiveLoadFailed
    except ImportError:
        on_problem(
            Problem(
                path,
                ProblemKind.NO_WARCIO,
                "reading WARC files needs warcio: pip install 'percolite[webindex]'",
            )
        )
        return
    try:
        f = open(path, "rb")
    except OSError as e:
        on_problem(Problem(path, ProblemKind.UNREADABLE, e.strerror or str(e)))
        return
    with f:
        try:
            for record in ArchiveIterator(f):
                uri = record.rec_headers.get_header("WARC-Target-URI") or "?"
                location = f"{path}: {uri}"
                content_type = (
                    record.http_headers.get_header("Content-Type")
                    if (record.http_headers)
                    else None
                )
                if record.rec_type != "response" or "html" not in (content_type or "").lower():
                    if record.rec_type not in ("warcinfo", "request", "metadata"):
                        on_problem(
                            Problem(location, ProblemKind.NOT_RESPONSE, "not an HTML response")
                        )
                    continue
                try:
                    url = normalize(uri)
                except ValueError:
                    url = None
                if url is None:
                    on_problem(Problem(location, ProblemKind.BAD_URL, "not an http(s) URL"))
                    continue
                data = record.content_stream().read()
                page = _html_page(location, url, data, content_type, on_problem)
                if page is not None:
                    yield page
        except (ArchiveLoadFailed, OSError, EOFError, ValueError) as e:
            on_problem(Problem(path, ProblemKind.UNREADABLE, str(e)))


def pages_of(
    path: str,
    base_url: str | None,
    on_problem: OnProblem = _ignore,
    known: Mapping[str, tuple[str, str]] | None = None,
) -> Iterator[Page]:
    """The pages of one PATH argument: a directory (which needs
    ``base_url``; ``known`` as for :func:`directory_pages`), a file of link
    records or a WARC file. Raises ValueError for a directory without
    ``base_url`` and a file of unknown kind; a missing path is reported as a
    problem."""
    if os.path.isdir(path):
        if not base_url:
            raise ValueError(
                f"{path} is a directory: --base-url is needed for its pages' URLs "
                "(e.g. --base-url https://example.org/docs/)"
            )
        return directory_pages(path, base_url, on_problem, known)
    if not os.path.exists(path):
        on_problem(Problem(path, ProblemKind.MISSING_PATH, "no such file or directory"))
        return iter(())
    name = path.lower()
    if name.endswith(WARC_SUFFIXES):
        return warc_pages(path, on_problem)
    if name.endswith(RECORD_SUFFIXES):
        return record_pages(path, on_problem)
    raise ValueError(
        f"{path}: unknown kind of file; expected a directory of HTML files, link records "
        f"({', '.join(RECORD_SUFFIXES)}) or a WARC file ({', '.join(WARC_SUFFIXES)})"
    )
