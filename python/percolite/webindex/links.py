"""A page's outlinks: the URI rules and the HTML link extraction.

The rules, which every input of webindex follows:

* a page's outlinks are the set of targets of its ``<a href>`` elements,
  resolved against the page's URL (the first ``<base href>``, itself
  resolved against the page's URL, replaces it), http and https only;
* a target is normalized: the fragment dropped, scheme and host
  lower-cased, a default port (80 for http, 443 for https) dropped, an
  empty path made ``/``; nothing else changes (``dir/`` and
  ``dir/index.html`` are different URIs, percent-escapes and case in the
  path are kept). An ``href`` is stripped of surrounding ASCII whitespace
  first, and :func:`urllib.parse.urljoin` resolves it (which also removes
  tabs and newlines inside it, as browsers do);
* an ``href`` that does not parse (a bad port, an unclosed IPv6 bracket,
  no host) is skipped and counted;
* a link to the page itself does not count;
* the anchor text of a target is the text of the first ``<a>`` element
  linking to it, whitespace collapsed; an ``<a>`` ends at its ``</a>`` or
  at the next ``<a>``.

Parsing is the standard library's :class:`html.parser.HTMLParser`, so on
malformed pages the links are whatever it reports (it does not repair
nesting as a browser's parser does: an unclosed ``<a>`` takes the text up
to the next ``<a>`` or the end of the page).

A page's bytes are decoded by the charset of its HTTP header when it has
one, else of its ``<meta charset>`` or ``<meta http-equiv="Content-Type">``
in the first 4 KiB, else as UTF-8; undecodable bytes are replaced (U+FFFD),
and an unknown charset name counts as none.
"""

from __future__ import annotations

import codecs
import re
from html.parser import HTMLParser
from typing import NamedTuple
from urllib.parse import urljoin, urlsplit

__all__ = [
    "normalize",
    "domain_of",
    "extract_links",
    "decode_page",
    "charset_of",
    "Links",
    "resolve_links",
]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ASCII_WHITESPACE = " \t\n\f\r"
# An absolute http(s) URL already normalized, but perhaps for its empty path:
# lower-case scheme and host, no port, user, query or fragment, and only
# characters in its path that neither urljoin nor urlsplit change or split
# on. The rules give it unchanged ("/" added to an empty path), whatever the
# base: urljoin returns an absolute URL with a host as it is. Most links of
# link records, and many of pages, are such; parsing them was most of the
# time of reading link records.
_NORMAL_ABSOLUTE = re.compile(r"https?://[a-z0-9.-]+(/[A-Za-z0-9._~%+,=:@!$&'()*/-]*)?\Z").match


def normalize(url: str, base: str | None = None) -> str | None:
    """``url`` resolved against ``base`` and normalized by the rules above;
    None when it is not http(s). Raises ValueError when it does not parse."""
    plain = _NORMAL_ABSOLUTE(url)
    if plain is not None:
        return url if plain.group(1) else url + "/"
    url = url.strip(_ASCII_WHITESPACE)
    if base is not None:
        url = urljoin(base, url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        return None
    host = parts.hostname  # lower-cased by urllib
    if not host:
        raise ValueError(f"no host in {url!r}")
    port = parts.port  # raises ValueError for a port that is not a number in range
    if ":" in host:
        host = f"[{host}]"
    netloc = host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc = f"{host}:{port}"
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        netloc = f"{userinfo}@{netloc}"
    path = parts.path or "/"
    # An empty query ("x?") is kept as written: urlunsplit would drop it.
    has_query = "?" in url.split("#", 1)[0][len(scheme) + 1 :]
    return f"{scheme}://{netloc}{path}" + (f"?{parts.query}" if has_query else "")


def domain_of(uri: str) -> str:
    """The domain of a normalized URI: its host (without port or brackets)."""
    # Called for every URI change and export entry: a normalized URI always
    # has "scheme://", a lower-case host and a path starting with "/", so
    # string splitting gives what urlsplit(uri).hostname would.
    scheme, sep, rest = uri.partition("://")
    netloc, slash, _ = rest.partition("/")
    if not sep or not slash or "?" in netloc or "#" in netloc:
        return urlsplit(uri).hostname or ""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):
        return host[1 : host.find("]")].lower()
    return host.partition(":")[0].lower()


class Links(NamedTuple):
    """A page's outlinks: ``{target: anchor}`` in document order, and how
    many ``href`` values did not parse."""

    links: dict[str, str]
    bad_hrefs: int


def resolve_links(page_url: str, hrefs: list[tuple[str, str]], base: str | None = None) -> Links:
    """Applies the rules to ``(href, anchor)`` pairs of the page at
    ``page_url`` (a normalized URI), with ``base`` its ``<base href>``."""
    links: dict[str, str] = {}
    bad = 0
    resolve_against = page_url
    if base is not None:
        try:
            resolve_against = urljoin(page_url, base.strip(_ASCII_WHITESPACE))
            urlsplit(resolve_against).port  # noqa: B018 - a bad base port raises here
        except ValueError:
            resolve_against = page_url
    for href, anchor in hrefs:
        try:
            target = normalize(href, resolve_against)
        except ValueError:
            bad += 1
            continue
        if target is None or target == page_url or target in links:
            continue
        links[target] = " ".join(anchor.split())
    return Links(links, bad)


class _LinkParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.base: str | None = None
        self.hrefs: list[tuple[str, str]] = []
        self._text: list[str] | None = None  # the open <a href>'s text
        self._href = ""

    def _close_anchor(self) -> None:
        if self._text is not None:
            self.hrefs.append((self._href, "".join(self._text)))
            self._text = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._close_anchor()
            href = next((v for k, v in attrs if k == "href"), None)
            if href is not None:
                self._href, self._text = href, []
        elif tag == "base" and self.base is None:
            href = next((v for k, v in attrs if k == "href"), None)
            if href is not None:
                self.base = href

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag == "a":
            self._close_anchor()

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._close_anchor()

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def close(self) -> None:
        super().close()
        self._close_anchor()


def extract_links(page_url: str, html: str) -> Links:
    """The outlinks of the page at ``page_url`` (a normalized URI) with text ``html``."""
    parser = _LinkParser()
    parser.feed(html)
    parser.close()
    return resolve_links(page_url, parser.hrefs, parser.base)


_META_CHARSET = re.compile(
    rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE
)
_HEADER_CHARSET = re.compile(r"""charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def _known(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def charset_of(data: bytes, content_type: str | None = None) -> str | None:
    """The declared charset of a page (a Python codec name), or None: the
    HTTP ``Content-Type`` header's, else the ``<meta>``'s in the first 4 KiB."""
    if content_type:
        m = _HEADER_CHARSET.search(content_type)
        found = _known(m.group(1)) if m else None
        if found:
            return found
    m = _META_CHARSET.search(data[:4096])
    return _known(m.group(1).decode("ascii")) if m else None


def decode_page(data: bytes, content_type: str | None = None) -> tuple[str, bool]:
    """A page's text, and whether bytes had to be replaced to decode it."""
    charset = charset_of(data, content_type) or "utf-8"
    try:
        return data.decode(charset), False
    except UnicodeDecodeError:
        return data.decode(charset, errors="replace"), True
