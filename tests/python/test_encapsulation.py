"""Objects keep to their own private names.

Every module under ``python/percolite`` is parsed (never imported) with
:mod:`ast`. A reach into another object's privates is an attribute access
``X._name`` (one leading underscore: ``__dunder__`` names are protocols,
open to everyone), or ``getattr``/``setattr``/``hasattr``/``delattr`` of
``X`` with the literal ``"_name"``, anywhere in a module, unless:

* ``X`` is the object's own: ``self``, ``cls`` or ``super()``;
* ``X`` is a module object (a name an ``import`` binds to a module, or an
  attribute chain of them) and ``X._name`` is a module of the package
  (``percolite._core``, ``_export``): the package's private modules are its
  internals, shared by all its modules;
* ``X`` is ``percolite._core``, the compiled module: it has no private
  names, its names are its API for the package;
* ``(module, "_name")`` is in :data:`FRIENDS`, an allow-list of documented
  friends, each with its reason (and a comment at the class that has the
  friend).

A module's own private names are its own like an object's: reaching them
through the module object (``_export._injected``) counts. Imports of a
private name from a sibling module (the exporters' ``from ._common import
_claim``) are not attribute accesses and are not checked here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "python" / "percolite"
COMPILED = {"percolite._core"}

# (module path relative to python/percolite, private name) -> why the module
# may use that name of an object that is not its own. Keep it short: a new
# entry needs a reason why a public, documented method or property will not do.
FRIENDS: dict[tuple[str, str], str] = {}

_REFLECTION = {"getattr", "setattr", "hasattr", "delattr"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def module_names(package_dir: Path) -> set[str]:
    """The dotted names of the package's modules: its ``.py`` files (a
    package is named after its directory) and ``.pyi`` stubs of compiled
    modules."""
    base = package_dir.parent
    names = set()
    for path in package_dir.rglob("*.py*"):
        if path.suffix not in (".py", ".pyi"):
            continue
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.add(".".join(parts))
    return names


def _bound_modules(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> dict:
    """``{name: dotted module}`` for every name an import in ``tree`` binds
    to a module (at any depth: a file's imports are approximated as one
    scope). ``from X import y`` binds a module only when ``X.y`` is a module
    of the package."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    first = alias.name.split(".")[0]
                    bound[first] = first
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                if not is_package:
                    parts.pop()
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def _module_of(node: ast.expr, bound: Mapping[str, str], known: set[str]) -> str | None:
    """The dotted module ``node`` names (a bound name, or an attribute of a
    package that is itself a module), else None."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        parent = _module_of(node.value, bound, known)
        if parent is not None and f"{parent}.{node.attr}" in known:
            return f"{parent}.{node.attr}"
    return None


def _is_own(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "super"
        and not node.args
    )


def _accesses(tree: ast.AST) -> Iterable[tuple[ast.expr, str, int]]:
    """``(X, name, line)`` of every ``X._name`` and every reflective use of
    a literal ``"_name"`` on ``X``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            yield node.value, node.attr, node.lineno
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _REFLECTION
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
        ):
            yield node.args[0], node.args[1].value, node.lineno


def reaches(
    package_dir: Path = PACKAGE_DIR, friends: Mapping[tuple[str, str], str] = FRIENDS
) -> tuple[list[str], set[tuple[str, str]]]:
    """The reaches into other objects' privates in the package, as
    ``"path:line: X._name"``, and the friend entries that allowed one."""
    known = module_names(package_dir)
    base = package_dir.parent
    found, used = [], set()
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir).as_posix()
        parts = list(path.relative_to(base).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound = _bound_modules(tree, ".".join(parts), is_package, known)
        for owner, name, line in sorted(_accesses(tree), key=lambda access: access[2]):
            if _is_own(owner):
                continue
            module = _module_of(owner, bound, known)
            if module is not None and (f"{module}.{name}" in known or module in COMPILED):
                continue
            if (relative, name) in friends:
                used.add((relative, name))
                continue
            found.append(f"{relative}:{line}: {ast.unparse(owner)}.{name}")
    return found, used


def test_no_module_reaches_into_another_objects_privates():
    found, _used = reaches()
    assert not found, (
        "private names of other objects used (give the owner a public, documented method "
        "or property, or pass a callback; FRIENDS only when neither will do):\n  "
        + "\n  ".join(found)
    )


def test_every_friend_is_still_needed():
    _found, used = reaches()
    stale = set(FRIENDS) - used
    assert not stale, f"FRIENDS entries that allow nothing any more: {sorted(stale)}"


def test_every_friend_gives_its_reason():
    assert all(reason.strip() for reason in FRIENDS.values())


def _package(tmp_path: Path, modules: Mapping[str, str]) -> Path:
    package = tmp_path / "percolite"
    for name, source in modules.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return package


def test_the_check_finds_what_it_is_meant_to(tmp_path):
    """The rule itself, on a made-up package: what is reported, what is
    allowed, and that a friend entry allows only its module and name."""
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "_core.pyi": "def f() -> None: ...\n",
            "_export.py": "_injected = 1\n",
            "_app.py": (
                "class App:\n"
                "    def __init__(self):\n"
                "        self._envs = set()\n"
                "    def bind(self, env):\n"
                "        self._envs.add(env)\n"
                "        super()._setup()\n"
                "        return cls._made if False else self.__dict__\n"
            ),
            "_env.py": (
                "import percolite\n"
                "from . import _core, _export\n"
                "def bind(app, env):\n"
                "    app._envs.add(env)\n"
                "    getattr(app, '_envs')\n"
                "    percolite._core.f()\n"
                "    _core._hidden\n"
                "    return _export._injected, app.__class__\n"
            ),
            "ui/_data.py": ("from .. import _env\ndef read(env):\n    return env._core\n"),
        },
    )
    found, used = reaches(package, {})
    assert found == [
        "_env.py:4: app._envs",
        "_env.py:5: app._envs",
        "_env.py:8: _export._injected",
        "ui/_data.py:3: env._core",
    ]
    found, used = reaches(package, {("ui/_data.py", "_core"): "the console reads the core"})
    assert "ui/_data.py:3: env._core" not in found and len(found) == 3
    assert used == {("ui/_data.py", "_core")}
