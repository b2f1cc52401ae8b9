"""Writes docs/api.md, the API reference, from the installed package's docstrings.

Usage (after installing the package into the venv, as scripts/bootstrap.sh does):

    .venv/bin/python scripts/gen_api_docs.py          # rewrite docs/api.md
    .venv/bin/python scripts/gen_api_docs.py --check  # exit 1 when docs/api.md is stale

Documents every name in ``__all__`` of ``percolite``, ``percolite.exporters`` and
``percolite.codecs``: functions with their signatures, classes with their
constructor (unless the docstring says another call creates them), public
methods and properties, enums with their members, named tuples with their
fields. Standard library only (``inspect``); tests/python/test_api_docs.py
fails when the committed page differs from what this script renders.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import re
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"
MODULES = ("percolite", "percolite.exporters", "percolite.codecs")
# A class whose own docstring says this is made by another call: its
# __init__ is internal, so its signature is not shown.
MADE_ELSEWHERE = re.compile(r"create\s+it\s+with|get\s+one\s+from|never\s+create", re.I)
# Dunder methods users call directly (others, like __enter__, are summarised).
PUBLIC_DUNDERS = ("__call__",)

HEADER = """\
# API reference

Generated from the docstrings by `scripts/gen_api_docs.py`; do not edit by
hand. After changing a public name or a docstring, reinstall the package and
run `.venv/bin/python scripts/gen_api_docs.py` (the test suite fails while
this page is stale). The guides explain the concepts: [index](index.md).
"""


def _clean(doc: str | None) -> str:
    """A docstring as Markdown: Sphinx roles become code spans, ``::`` a colon."""
    if not doc:
        return ""
    doc = inspect.cleandoc(doc)
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", doc)
    doc = re.sub(r"(\S)::$", r"\1:", doc, flags=re.M)
    doc = re.sub(r"^::$", "", doc, flags=re.M)
    return doc.strip()


def _annotation(annotation: Any) -> str:
    if isinstance(annotation, str):  # `from __future__ import annotations`
        return annotation
    if isinstance(annotation, typing.ForwardRef):  # NamedTuple fields
        return annotation.__forward_arg__
    return inspect.formatannotation(annotation)


def _signature(obj: Any, drop_first: bool = False, returns: bool = True) -> str:
    """``(a, b: int = 1, *, c=None) -> str``, formatted here rather than by
    ``str(Signature)`` so that string annotations print without quotes; ""
    when there is no signature to show."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    params = list(signature.parameters.values())
    if drop_first and params:
        params = params[1:]
    parts: list[str] = []
    keyword_marker_needed = True
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            keyword_marker_needed = False
        if p.kind is p.KEYWORD_ONLY and keyword_marker_needed:
            parts.append("*")
            keyword_marker_needed = False
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += ": " + _annotation(p.annotation)
        if p.default is not p.empty:
            default = _default(p.default, p.name)
            text += f" = {default}" if p.annotation is not p.empty else f"={default}"
        parts.append(text)
        if p.kind is p.POSITIONAL_ONLY and (
            i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY
        ):
            parts.append("/")
    result = f"({', '.join(parts)})"
    if returns and signature.return_annotation is not signature.empty:
        result += " -> " + _annotation(signature.return_annotation)
    return result


def _default(value: Any, name: str = "") -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if name == "mode" and isinstance(value, int):  # permission bits read best in octal
        return oct(value)
    return repr(value)


def _public_classes() -> dict[type, str]:
    """Every public class, with the name it is documented under first."""
    classes: dict[type, str] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                classes.setdefault(obj, f"{module_name}.{name}")
    return classes


def _own_doc(cls: type, name: str) -> str | None:
    """The docstring of member ``name`` from the first percolite class of
    ``cls``'s MRO that documents it (never a builtin's, like ``__call__``'s)."""
    for owner in _own_mro(cls):
        raw = owner.__dict__.get(name)
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        doc = getattr(raw, "__doc__", None)
        if doc:
            return doc
    return None


class _Renderer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.missing: list[str] = []  # public names without a docstring
        self.documented: dict[int, str] = {}  # id(object) -> where it was documented
        self.public_classes = _public_classes()

    def out(self, text: str = "") -> None:
        self.lines.append(text)

    def doc(self, qualified: str, doc: str | None) -> None:
        text = _clean(doc)
        if not text:
            self.missing.append(qualified)
            return
        self.out(text)
        self.out()

    # -- modules --------------------------------------------------------------
    def module(self, module: ModuleType) -> None:
        self.out(f"## `{module.__name__}`")
        self.out()
        self.doc(module.__name__, module.__doc__)
        for name in module.__all__:
            self.member(module, name, getattr(module, name))

    def member(self, module: ModuleType, name: str, obj: Any) -> None:
        qualified = f"{module.__name__}.{name}"
        if id(obj) in self.documented:
            self.out(f"### `{qualified}`")
            self.out()
            self.out(f"The same object as `{self.documented[id(obj)]}`.")
            self.out()
        elif inspect.ismodule(obj):
            self.out(f"### `{qualified}` (module)")
            self.out()
            self.out(f"Documented in its own section below: `{obj.__name__}`.")
            self.out()
        elif inspect.isclass(obj):
            self.documented[id(obj)] = qualified
            self.klass(qualified, obj)
        elif callable(obj):
            self.documented[id(obj)] = qualified
            self.out(f"### `{qualified}{_signature(obj)}`")
            self.out()
            self.doc(qualified, obj.__doc__)
        else:
            self.constant(qualified, obj)

    def constant(self, qualified: str, value: Any) -> None:
        self.out(f"### `{qualified} = {_default(value)}`")
        self.out()
        if isinstance(value, enum.Enum):
            self.out(f"Shorthand for `{type(value).__name__}.{value.name}`.")
        else:
            self.out(f"A constant ({type(value).__name__}).")
        self.out()

    # -- classes --------------------------------------------------------------
    def klass(self, qualified: str, cls: type) -> None:
        own_doc = cls.__dict__.get("__doc__")
        bases = [b for b in cls.__bases__ if b in self.public_classes]
        if issubclass(cls, enum.Enum):
            self.out(f"### `class {qualified}` (enum)")
        elif _is_named_tuple(cls):
            self.out(f"### `class {qualified}{_signature(cls, returns=False)}` (named tuple)")
        elif issubclass(cls, BaseException):
            self.out(f"### `exception {qualified}`")
        elif own_doc and MADE_ELSEWHERE.search(own_doc):
            self.out(f"### `class {qualified}`")
        else:
            self.out(f"### `class {qualified}{_signature(cls, returns=False)}`")
        self.out()
        if bases:
            names = ", ".join(f"`{self.public_classes[b]}`" for b in bases)
            self.out(f"Subclass of {names}: what is documented there applies here too.")
            self.out()
        self.doc(qualified, own_doc)
        if issubclass(cls, enum.Enum):
            for member in cls:
                self.out(f"- `{cls.__name__}.{member.name}` = `{member.value!r}`")
            self.out()
            return
        if _is_named_tuple(cls):
            self.out("Fields: " + ", ".join(f"`{f}`" for f in cls._fields) + ".")
            self.out()
        for name, raw in self.class_members(cls):
            self.method(qualified, cls, name, raw)

    def class_members(self, cls: type) -> list[tuple[str, Any]]:
        """Public methods and properties defined by ``cls`` or by its private
        bases (those of public bases are documented with the base)."""
        seen: set[str] = set()
        members = []
        for owner in _own_mro(cls):
            if owner is not cls and owner in self.public_classes:
                continue
            for name, raw in owner.__dict__.items():
                if name in seen:
                    continue
                if name.startswith("_") and name not in PUBLIC_DUNDERS:
                    continue
                if _is_named_tuple(cls) and name in cls._fields:
                    continue
                if not isinstance(raw, (property, staticmethod, classmethod)) and not (
                    inspect.isfunction(raw)
                ):
                    continue
                seen.add(name)
                members.append((name, raw))
        return members

    def method(self, class_name: str, cls: type, name: str, raw: Any) -> None:
        qualified = f"{class_name}.{name}"
        if isinstance(raw, property):
            self.out(f"#### `{qualified}` (property)")
            self.out()
            self.doc(qualified, _own_doc(cls, name))
            return
        if isinstance(raw, staticmethod):
            self.out(f"#### `{qualified}{_signature(raw.__func__)}` (static method)")
        elif isinstance(raw, classmethod):
            self.out(f"#### `{qualified}{_signature(getattr(cls, name))}` (class method)")
        else:
            self.out(f"#### `{qualified}{_signature(raw, drop_first=True)}`")
        self.out()
        self.doc(qualified, _own_doc(cls, name))


def _own_mro(cls: type) -> list[type]:
    """The classes of ``cls``'s MRO that belong to percolite (not builtins,
    ``enum``, ``typing``)."""
    return [c for c in cls.__mro__ if c.__module__.split(".")[0] == "percolite"]


def _is_named_tuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def render() -> tuple[str, list[str]]:
    """The page, and the public names that have no docstring."""
    renderer = _Renderer()
    renderer.out(HEADER)
    for module_name in MODULES:
        renderer.module(importlib.import_module(module_name))
    text = "\n".join(renderer.lines).rstrip() + "\n"
    return text, renderer.missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args(argv)
    text, missing = render()
    for name in missing:
        print(f"gen_api_docs: no docstring: {name}", file=sys.stderr)
    if args.check:
        stale = not OUTPUT.exists() or OUTPUT.read_text() != text
        if stale:
            print(f"{OUTPUT} is stale: run python scripts/gen_api_docs.py", file=sys.stderr)
        return 1 if stale or missing else 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
