"""Where phrasecount's documents come from: the standard library, or files.

A :class:`Document` is a location (its key) and a text. Documents with
identical text are one *unique document*, identified by :func:`content_id`;
any number of locations may point to it.

Two sources, both deterministic (same input, same documents in the same order):

* :func:`stdlib_documents`, the built-in corpus every machine has: the
  docstrings of the running Python's standard library, one document per module,
  read with :mod:`ast` (nothing is imported).
* :func:`file_documents`, the files under the PATHs a user names.

Bad input never stops a run: what is skipped is reported to an ``on_problem``
callback as a :class:`Problem`, and reading goes on.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import os
import stat
import sysconfig
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

__all__ = [
    "CONTENT_ID_BYTES",
    "Document",
    "Problem",
    "ProblemKind",
    "content_id",
    "stdlib_documents",
    "STDLIB_EXCLUDED_DIRECTORIES",
    "file_documents",
]


class Document(NamedTuple):
    """One document: ``location`` is its key, ``content`` its text."""

    location: str
    content: str


# The bytes of a content id's digest (content_id is their hex).
CONTENT_ID_BYTES = hashlib.sha256().digest_size


def content_id(content: str) -> str:
    """The key of the unique document with this text: SHA-256 hex of its UTF-8 bytes.

    Two documents have the same id exactly when their texts are equal. Lone
    surrogates (possible in docstrings) are encoded with ``surrogatepass`` so
    every ``str`` has an id.
    """
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()


class ProblemKind(enum.Enum):
    """Why something was skipped."""

    MISSING_PATH = "missing path"  # a PATH given by the caller does not exist
    UNREADABLE = "unreadable"  # opening, listing or reading failed (OSError)
    BINARY = "binary"  # the file contains a NUL byte
    NOT_UTF8 = "not UTF-8"  # the file is not valid UTF-8
    NOT_REGULAR = "not a regular file"  # FIFO, socket, device
    LINK_NOT_FOLLOWED = "link not followed"  # symbolic link to a directory, inside a walk
    UNPARSABLE = "unparsable"  # a standard-library module ast cannot parse


class Problem(NamedTuple):
    """Something skipped: where, which kind of problem, and a sentence for people."""

    location: str
    kind: ProblemKind
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}"


OnProblem = Callable[[Problem], None]


def _ignore(problem: Problem) -> None:
    pass


# -- the standard library ------------------------------------------------------------

# Test suites (the top-level ``test`` package, ``*/test``, ``*/tests``,
# ``idlelib/idle_test``) are not library documentation, are most of the source
# by size, and hold files that do not parse on purpose.
STDLIB_EXCLUDED_DIRECTORIES = frozenset({"test", "tests", "idle_test", "__pycache__"})

_DOCSTRING_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_documents(
    on_problem: OnProblem | None = None, *, root: str | os.PathLike[str] | None = None
) -> Iterator[Document]:
    """The built-in corpus: one document per standard-library module, sorted by module name.

    Modules are the ``.py`` files under ``root`` (by default the running
    Python's, ``sysconfig.get_paths()["stdlib"]``) whose path is a dotted
    module name: directories are descended only when their name is an
    identifier, which leaves out ``site-packages``, ``lib-dynload``,
    ``config-*`` and hidden directories; the test suites
    (:data:`STDLIB_EXCLUDED_DIRECTORIES`) are left out too. Everything else
    is in, ``idlelib``, ``turtledemo`` and ``encodings`` included.

    A document's location is ``"stdlib:"`` and the module name
    (``stdlib:json.decoder``; a package is its ``__init__.py``:
    ``stdlib:json``). Its content is the module docstring and every class and
    function docstring, in source order, each cleaned by
    :func:`ast.get_docstring`, separated by blank lines. Modules without any
    docstring give no document. Files are parsed, never imported; a file that
    cannot be read or parsed is reported to ``on_problem`` (if given) and
    skipped. The corpus is the same on every run of the same Python
    installation, and differs between Python versions.
    """
    report = on_problem or _ignore
    if root is None:
        root = sysconfig.get_paths()["stdlib"]
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no standard library directory at {os.fspath(root)!r}")
    for module, path in sorted(_stdlib_modules(os.fspath(root)).items()):
        docstrings = _module_docstrings(path, report)
        if docstrings:
            yield Document(f"stdlib:{module}", "\n\n".join(docstrings))


def _stdlib_modules(root: str) -> dict[str, str]:
    """``{dotted module name: path}`` of every included ``.py`` file under ``root``."""
    modules: dict[str, str] = {}
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [
            name
            for name in subdirectories
            if name.isidentifier() and name not in STDLIB_EXCLUDED_DIRECTORIES
        ]
        package = os.path.relpath(directory, root).replace(os.sep, ".")
        prefix = "" if package == "." else package + "."
        for name in files:
            stem, extension = os.path.splitext(name)
            if extension != ".py" or not stem.isidentifier():
                continue
            if stem != "__init__":
                modules.setdefault(prefix + stem, os.path.join(directory, name))
            elif prefix:  # like import, a package wins over a module file of the same name
                modules[prefix[:-1]] = os.path.join(directory, name)
    return modules


def _module_docstrings(path: str, report: OnProblem) -> list[str]:
    """The docstrings of one module in source order; ``[]`` if it has none or cannot be read."""
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as error:
        report(Problem(path, ProblemKind.UNREADABLE, _os_reason(error)))
        return []
    try:
        with warnings.catch_warnings():
            # e.g. SyntaxWarning for an invalid escape: not ours to show.
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        # ValueError covers source that is not valid in its declared encoding.
        report(Problem(path, ProblemKind.UNPARSABLE, f"cannot parse: {error}"))
        return []
    owners = sorted(_docstring_owners(tree), key=lambda node: getattr(node, "lineno", 0))
    docstrings = (ast.get_docstring(node, clean=True) for node in owners)
    return [docstring for docstring in docstrings if docstring]


# Classes and functions are statements, so only statement lists need visiting:
# a third of the time of ast.walk, which visits every expression node too.
_STATEMENT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")


def _docstring_owners(tree: ast.Module) -> Iterator[ast.AST]:
    """The module, class and function nodes of ``tree``, in no particular order."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, _DOCSTRING_OWNERS):
            yield node
        for field in _STATEMENT_LISTS:
            children = getattr(node, field, None)
            if isinstance(children, list):
                pending.extend(children)


# -- files -------------------------------------------------------------------------


def file_documents(
    paths: Iterable[str | os.PathLike[str]], on_problem: OnProblem
) -> Iterator[Document]:
    """The text files at ``paths``, each a document located at its absolute path.

    Each PATH may be a file or a directory; PATHs are read in the order
    given. Directories are walked recursively in sorted pre-order (each
    entry in name order, a subdirectory's files before the next entry, as
    ``find`` lists them).
    Inside a walk, hidden entries (name starting with ``.``: ``.git``,
    ``.venv``...) are skipped silently, symbolic links to files are read,
    and symbolic links to directories are not followed (reported, kind
    ``LINK_NOT_FOLLOWED``: no cycles, no escaping the tree). A PATH itself is
    always read or walked, hidden or linked. The location is
    ``os.path.abspath`` of the path walked (links are not resolved), and each
    location is read at most once even when PATHs overlap.

    A file is read whole. It is skipped and reported when it cannot be opened
    or read (``UNREADABLE``: permission denied, broken or looping link, gone
    since its directory was listed), contains a NUL byte (``BINARY``), is not
    valid UTF-8 (``NOT_UTF8``: no guessing of other encodings, no silently
    replaced characters), or is a FIFO, socket or device (``NOT_REGULAR``,
    never opened for a blocking read).

    PATHs that do not exist are reported (``MISSING_PATH``) before this
    function returns, so a caller can refuse to start; every other problem is
    reported while the returned iterator runs, before the next document.
    """
    roots = []
    for path in paths:
        location = os.path.abspath(os.fspath(path))
        missing = _missing_reason(location)
        if missing:
            on_problem(Problem(_printable(location), ProblemKind.MISSING_PATH, missing))
        else:
            roots.append(location)
    return _walk(roots, on_problem)


def _missing_reason(location: str) -> str | None:
    """Why the PATH ``location`` does not exist; ``None`` if it does (readable or not)."""
    try:
        os.stat(location)
    except (FileNotFoundError, NotADirectoryError):
        return "broken symbolic link" if os.path.lexists(location) else "no such file or directory"
    except ValueError:
        return "not a valid path (contains a NUL character)"
    except OSError:
        return None  # it exists; reading it reports why it cannot be read
    return None


def _overlapping(roots: list[str]) -> bool:
    """Whether a root is given twice or lies under a directory root: only
    then can the walks meet one location twice (a walk of one directory,
    which follows no link to a directory, never does)."""
    directories = [root.rstrip(os.sep) + os.sep for root in roots if os.path.isdir(root)]
    return len(set(roots)) < len(roots) or any(
        root.startswith(directory) for root in roots for directory in directories
    )


def _walk(roots: list[str], on_problem: OnProblem) -> Iterator[Document]:
    # The locations met, to read each once: kept only when roots overlap
    # (100,000 of them would hold some 15 MB).
    seen: set[str] | None = set() if _overlapping(roots) else None
    for root in roots:
        if os.path.isdir(root):
            files = _files_under(root, on_problem)
        else:
            files = iter([root])
        for location in files:
            if not _is_utf8_name(location):
                reason = "name is not valid UTF-8"
                on_problem(Problem(_printable(location), ProblemKind.UNREADABLE, reason))
                continue
            if seen is not None:
                if location in seen:
                    continue
                seen.add(location)
            content = _read_text(location, on_problem)
            if content is not None:
                yield Document(location, content)


def _files_under(root: str, on_problem: OnProblem) -> Iterator[str]:
    """Every file location under the directory ``root``, in sorted pre-order (as ``find``).

    A directory is listed when the walk reaches it, so a file removed after
    that is still yielded (and reported unreadable when read).
    """
    pending = [_sorted_entries(root, on_problem)]  # one iterator per open directory
    while pending:
        entry = next(pending[-1], None)
        if entry is None:
            pending.pop()
        elif entry.name.startswith("."):
            continue
        elif not _is_directory(entry):
            # Files, links to files, broken links, FIFOs...: _read_text sorts them out.
            yield entry.path
        elif entry.is_symlink():
            reason = "symbolic link to a directory, not followed"
            on_problem(Problem(entry.path, ProblemKind.LINK_NOT_FOLLOWED, reason))
        else:
            pending.append(_sorted_entries(entry.path, on_problem))


def _sorted_entries(directory: str, on_problem: OnProblem) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as scan:
            return iter(sorted(scan, key=lambda entry: entry.name))
    except OSError as error:
        on_problem(Problem(directory, ProblemKind.UNREADABLE, _os_reason(error)))
        return iter(())


def _is_directory(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False  # then reading it as a file reports why


# Never block opening a FIFO that was swapped in after the directory was listed.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def _read_text(location: str, on_problem: OnProblem) -> str | None:
    """The text of the file at ``location``, or ``None`` after reporting why it is skipped."""
    try:
        descriptor = os.open(location, _OPEN_FLAGS)
    except OSError as error:
        reason = _os_reason(error)
        if isinstance(error, FileNotFoundError) and os.path.islink(location):
            reason = "broken symbolic link"
        on_problem(Problem(location, ProblemKind.UNREADABLE, reason))
        return None
    try:
        with open(descriptor, "rb") as file:  # owns the descriptor from here
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                reason = "not a regular file (FIFO, socket or device)"
                on_problem(Problem(location, ProblemKind.NOT_REGULAR, reason))
                return None
            data = file.read()
    except OSError as error:
        on_problem(Problem(location, ProblemKind.UNREADABLE, _os_reason(error)))
        return None
    if b"\0" in data:
        on_problem(Problem(location, ProblemKind.BINARY, "binary file (contains NUL bytes)"))
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"not valid UTF-8 (byte 0x{data[error.start]:02x} at offset {error.start})"
        on_problem(Problem(location, ProblemKind.NOT_UTF8, reason))
        return None


def _os_reason(error: OSError) -> str:
    return error.strerror or str(error)


def _is_utf8_name(path: str) -> bool:
    """False for names that came from undecodable bytes (surrogate escapes)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(path: str) -> str:
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
