"""The code is in layers, each using only those below it.

Python: the package's modules import each other without cycles. C++: each
file of the core includes only headers of its own layer or below (the
layers are CPP_LAYERS, bottom up: base, backend, transaction, notifications,
workers, queues, env, bindings).

Python

Every module under ``python/percolite`` is parsed (never imported) with
:mod:`ast`, and every import of another module of the package is an edge:
relative imports and absolute ``percolite`` imports, at any depth (inside
functions and classes too, since those run as soon as the code does). Only
imports under ``if TYPE_CHECKING:`` (or ``if typing.TYPE_CHECKING:``) are left
out: they never run. The resulting graph must have no cycle.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterable, Mapping
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "python" / "percolite"

# module -> {imported module: [line numbers of the imports]}
Graph = Mapping[str, Mapping[str, list]]


def module_names(package_dir: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of the package: its
    ``.py`` files (a package's ``__init__.py`` is named after the package),
    and the ``.pyi`` stubs of compiled modules (``_core``)."""
    base = package_dir.parent
    names = {}
    for path in sorted(package_dir.rglob("*.py*"), key=lambda p: (p.suffix != ".py", p)):
        if path.suffix not in (".py", ".pyi"):
            continue
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.setdefault(".".join(parts), path)
    return names


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return (
        isinstance(test, ast.Attribute)
        and test.attr == "TYPE_CHECKING"
        and isinstance(test.value, ast.Name)
        and test.value.id == "typing"
    )


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth, except those only
    ``if TYPE_CHECKING:`` runs."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known) -> set:
    """The modules of the package that ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module if is_package else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
        # `from pkg import name` imports the submodule pkg.name when there is
        # one, else pkg itself.
        candidates = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
            for alias in node.names
        ]
    found = set()
    for name in candidates:
        # `import percolite.a.b` imports percolite.a.b: the nearest known module.
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, dict[str, list]]:
    """Which module of the package imports which, with the lines that do."""
    files = module_names(package_dir)
    graph: dict[str, dict[str, list]] = {name: {} for name in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in _imports(tree):
            for target in _targets(node, module, is_package, files):
                graph[module].setdefault(target, []).append(node.lineno)
    for imports in graph.values():
        for lines in imports.values():
            lines.sort()
    return graph


def find_cycle(graph: Graph) -> list | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it has none."""
    state: dict = {}  # node -> "open" (on the current path) or "done"
    for start in sorted(graph):
        if start in state:
            continue
        path = [start]
        state[start] = "open"
        stack = [iter(sorted(graph[start]))]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                state[path.pop()] = "done"
            elif state.get(child) == "open":
                return path[path.index(child) :] + [child]
            elif child not in state:
                state[child] = "open"
                path.append(child)
                stack.append(iter(sorted(graph.get(child, ()))))
    return None


def describe_cycle(graph: Graph, cycle: list, where: Mapping[str, str] | None = None) -> str:
    """``a -> b (a.py:12) -> ...``: each step with the lines of the import
    that takes it (``where`` names the file of each node, else the node)."""
    steps = [cycle[0]]
    for here, there in pairwise(cycle):
        lines = ", ".join(str(line) for line in graph[here][there])
        steps.append(f"{there} ({(where or {}).get(here, here)}:{lines})")
    return " -> ".join(steps)


def check_python_imports(package_dir: Path = PACKAGE_DIR) -> str | None:
    """A description of an import cycle among the package's modules, or None."""
    graph = import_graph(package_dir)
    cycle = find_cycle(graph)
    if cycle is None:
        return None
    base = package_dir.parent
    files = {name: str(path.relative_to(base)) for name, path in module_names(package_dir).items()}
    return describe_cycle(graph, cycle, files)


def test_python_modules_import_without_cycles():
    problem = check_python_imports()
    assert problem is None, f"import cycle: {problem}"


def test_the_check_sees_every_kind_of_import(tmp_path):
    # A package whose only cycle goes through imports in a function and an
    # absolute import; a TYPE_CHECKING import back does not count.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a, _native\n")
    (pkg / "_native.pyi").write_text("def f() -> None: ...\n")  # a compiled module's stub
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from . import c\n"
        "def f():\n"
        "    from .sub.b import g\n"
    )
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    import pkg\n")
    (pkg / "c.py").write_text("from .a import f\n")
    graph = import_graph(pkg)
    assert graph == {
        "pkg": {"pkg._native": [1], "pkg.a": [1]},
        "pkg._native": {},
        "pkg.a": {"pkg.sub.b": [5]},
        "pkg.c": {"pkg.a": [1]},
        "pkg.sub": {},
        "pkg.sub.b": {},
    }
    assert check_python_imports(pkg) is None
    (pkg / "sub" / "b.py").write_text("class G:\n    def m(self):\n        import pkg.c\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    assert check_python_imports(pkg) is not None


# --- C++: each file includes only headers of its own layer or below --------

CPP_ROOT = ROOT / "cpp"

# The core's layers, bottom up. A file's layer is that of the first patterns
# (paths under cpp/) it matches.
CPP_LAYERS = [
    (
        "base",
        [
            "include/percolite/status.h",
            "include/percolite/encoding.h",
            "src/encoding.cc",
            "include/percolite/latency.h",
            "include/percolite/mutex.h",
        ],
    ),
    (
        "backend",
        [
            "include/percolite/backend.h",
            "include/percolite/pg_target.h",
            "include/percolite/open_backend.h",
            "src/backend/*",
        ],
    ),
    ("transaction", ["include/percolite/transaction.h", "src/transaction.cc"]),
    (
        "notifications",
        [
            "include/percolite/notifications.h",
            "include/percolite/failures.h",
            "src/failures.cc",
            "include/percolite/identity.h",
            "src/identity.cc",
            "src/records.h",
        ],
    ),
    (
        "workers",
        [
            "include/percolite/workers.h",
            "src/workers.cc",
            "src/workers/*",
            "include/percolite/leases.h",
            "src/leases.cc",
        ],
    ),
    (
        "queues",
        [
            "include/percolite/queue_limits.h",
            "include/percolite/combine_queue.h",
            "include/percolite/export_queue.h",
            "src/queues/*",
        ],
    ),
    ("env", ["include/percolite/env.h", "src/env.cc"]),
    ("bindings", ["bindings/*"]),
]

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def cpp_layer_of(relative: str) -> int:
    """The index in CPP_LAYERS of the file at ``relative`` (a path under cpp/)."""
    for rank, (_, patterns) in enumerate(CPP_LAYERS):
        if any(fnmatch.fnmatch(relative, pattern) for pattern in patterns):
            return rank
    raise AssertionError(f"cpp/{relative} is in no layer: add it to CPP_LAYERS")


def resolve_include(cpp_root: Path, including: Path, name: str) -> str:
    """The path under cpp/ of the header ``#include "name"`` in ``including`` reads."""
    for base in (including.parent, cpp_root / "include", cpp_root / "src"):
        if (base / name).exists():
            return (base / name).resolve().relative_to(cpp_root.resolve()).as_posix()
    raise AssertionError(f'{including}: #include "{name}" is not a header of the core')


def upward_includes(cpp_root: Path) -> list[str]:
    """Every include of a header of a higher layer under ``cpp_root``, one line each."""
    found = []
    for path in sorted(cpp_root.rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        relative = path.relative_to(cpp_root).as_posix()
        rank = cpp_layer_of(relative)
        for name in _INCLUDE.findall(path.read_text()):
            header = resolve_include(cpp_root, path, name)
            header_rank = cpp_layer_of(header)
            if header_rank > rank:
                found.append(
                    f"cpp/{relative} ({CPP_LAYERS[rank][0]}) includes "
                    f"cpp/{header} ({CPP_LAYERS[header_rank][0]})"
                )
    return found


def test_cpp_files_include_only_their_layer_and_below():
    assert upward_includes(CPP_ROOT) == []


def test_the_cpp_check_reports_an_upward_include(tmp_path):
    # A backend file that includes workers.h, as the store once did.
    (tmp_path / "src" / "backend").mkdir(parents=True)
    (tmp_path / "include" / "percolite").mkdir(parents=True)
    (tmp_path / "include" / "percolite" / "workers.h").write_text("#pragma once\n")
    (tmp_path / "src" / "backend" / "store.cc").write_text('#include "percolite/workers.h"\n')
    assert upward_includes(tmp_path) == [
        "cpp/src/backend/store.cc (backend) includes cpp/include/percolite/workers.h (workers)"
    ]


# --- C++: units include each other without cycles --------------------------
#
# A unit is a header and the source file of the same name in the same layer
# (include/percolite/env.h with src/env.cc, src/backend/lmdb_backend.h with
# src/backend/lmdb_backend.cc). Includes between units must form no cycle:
# an interface whose unit includes its implementation's (backend.cc building
# every backend while lmdb_backend.h includes backend.h) is one.


def cpp_unit_of(relative: str) -> str:
    """``layer:stem`` of the file at ``relative`` (a path under cpp/)."""
    return f"{CPP_LAYERS[cpp_layer_of(relative)][0]}:{Path(relative).stem}"


def unit_graph(cpp_root: Path) -> dict[str, dict[str, list]]:
    """Which unit includes which, with the ``file:line`` of each include."""
    graph: dict[str, dict[str, list]] = {}
    for path in sorted(cpp_root.rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        relative = path.relative_to(cpp_root).as_posix()
        unit = cpp_unit_of(relative)
        graph.setdefault(unit, {})
        text = path.read_text()
        for match in _INCLUDE.finditer(text):
            header = cpp_unit_of(resolve_include(cpp_root, path, match.group(1)))
            if header != unit:
                line = text.count("\n", 0, match.end()) + 1
                graph[unit].setdefault(header, []).append(f"{relative}:{line}")
    return graph


def check_cpp_units(cpp_root: Path = CPP_ROOT) -> str | None:
    """A description of an include cycle among the core's units, or None."""
    graph = unit_graph(cpp_root)
    cycle = find_cycle(graph)
    if cycle is None:
        return None
    steps = [cycle[0]]
    for here, there in pairwise(cycle):
        steps.append(f"{there} ({', '.join(graph[here][there])})")
    return " -> ".join(steps)


def test_cpp_units_include_each_other_without_cycles():
    problem = check_cpp_units()
    assert problem is None, f"unit cycle: {problem}"


def test_the_unit_check_reports_an_interface_that_builds_its_implementation(tmp_path):
    backend = tmp_path / "src" / "backend"
    backend.mkdir(parents=True)
    (tmp_path / "include" / "percolite").mkdir(parents=True)
    (tmp_path / "include" / "percolite" / "backend.h").write_text("#pragma once\n")
    (backend / "lmdb_backend.h").write_text('#include "percolite/backend.h"\n')
    (backend / "lmdb_backend.cc").write_text('#include "lmdb_backend.h"\n')
    (backend / "backend.cc").write_text('#include "percolite/backend.h"\n')
    assert check_cpp_units(tmp_path) is None
    (backend / "backend.cc").write_text(
        '#include "percolite/backend.h"\n\n#include "lmdb_backend.h"\n'
    )
    assert check_cpp_units(tmp_path) == (
        "backend:backend -> backend:lmdb_backend (src/backend/backend.cc:3)"
        " -> backend:backend (src/backend/lmdb_backend.h:1)"
    )
