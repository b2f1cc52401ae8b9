"""python/percolite/_core.pyi declares everything the compiled percolite._core
exposes, as what it is (function, static method, method, property, constant),
with as many parameters, and nothing that it does not expose."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from percolite import _core

STUB = Path(__file__).resolve().parents[2] / "python" / "percolite" / "_core.pyi"


def _kind(node: ast.FunctionDef) -> str:
    decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
    if "property" in decorators:
        return "property"
    if "staticmethod" in decorators:
        return "static method"
    return "method"


def _stub_parameters(node: ast.FunctionDef, in_class: bool) -> int:
    args = node.args
    count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
    return count - (in_class and _kind(node) == "method")  # self


def _declared(body: list, in_class: bool) -> dict:
    """``{name: (kind, parameters or None)}`` of one stub scope."""
    found = {}
    for node in body:
        if isinstance(node, ast.FunctionDef):
            kind = _kind(node) if in_class else "function"
            parameters = None if kind == "property" else _stub_parameters(node, in_class)
            found[node.name] = (kind, parameters)
        elif isinstance(node, ast.ClassDef) and not in_class:
            found[node.name] = ("class", _declared(node.body, in_class=True))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = ("attribute", None)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = ("attribute", None)
    return {name: what for name, what in found.items() if not name.startswith("_")}


def _split_top_level(text: str) -> list:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def _bound_parameters(fn, name: str) -> int:
    """How many parameters pybind11's signature line of ``fn`` names (not
    self); for a function bound by hand, its text signature."""
    if getattr(fn, "__text_signature__", None):
        return len([p for p in inspect.signature(fn).parameters if p != "self"])
    first = (fn.__doc__ or "").lstrip().splitlines()[0]
    assert first.startswith(f"{name}("), f"{name}: no signature in {first!r}"
    depth = 0
    for index, char in enumerate(first):
        depth += char == "("
        depth -= char == ")"
        if char == ")" and depth == 0:
            params = _split_top_level(first[len(name) + 1 : index])
            return len([p for p in params if not p.startswith("self:") and p != "self"])
    raise AssertionError(f"{name}: unbalanced signature {first!r}")


def _exposed() -> dict:
    """``{name: (kind, parameters or members)}`` of the compiled module."""
    found = {}
    for name, obj in vars(_core).items():
        if name.startswith("_"):
            continue
        if inspect.isclass(obj):
            members = {}
            for member, raw in vars(obj).items():
                if member.startswith("_"):
                    continue
                if isinstance(raw, property):
                    members[member] = ("property", None)
                elif isinstance(raw, staticmethod):
                    members[member] = ("static method", _bound_parameters(raw.__func__, member))
                else:
                    members[member] = ("method", _bound_parameters(getattr(obj, member), member))
            found[name] = ("class", members)
        elif callable(obj):
            found[name] = ("function", _bound_parameters(obj, name))
        else:
            found[name] = ("attribute", None)
    return found


def _differences(exposed: dict, declared: dict, scope: str = "_core") -> list:
    problems = []
    for name in sorted(exposed.keys() - declared.keys()):
        problems.append(f"{scope}.{name} ({exposed[name][0]}) is not declared in _core.pyi")
    for name in sorted(declared.keys() - exposed.keys()):
        problems.append(f"{scope}.{name} is declared in _core.pyi but _core has no such name")
    for name in sorted(exposed.keys() & declared.keys()):
        (kind, detail), (stub_kind, stub_detail) = exposed[name], declared[name]
        if kind != stub_kind:
            problems.append(f"{scope}.{name} is a {kind}, declared as a {stub_kind}")
        elif kind == "class":
            problems += _differences(detail, stub_detail, f"{scope}.{name}")
        elif detail != stub_detail:
            problems.append(
                f"{scope}.{name} takes {detail} parameters, declared with {stub_detail}"
            )
    return problems


def test_the_stub_declares_everything_the_module_exposes():
    declared = _declared(ast.parse(STUB.read_text()).body, in_class=False)
    problems = _differences(_exposed(), declared)
    assert not problems, "python/percolite/_core.pyi is out of date:\n" + "\n".join(problems)


def test_the_comparison_sees_what_is_missing():
    # The check itself: a stub missing a method, a constant, or a parameter fails.
    exposed = _exposed()
    stub = ast.parse(STUB.read_text())
    for node in stub.body:
        if isinstance(node, ast.ClassDef) and node.name == "Transaction":
            node.body = [n for n in node.body if getattr(n, "name", "") != "commit"]
        if isinstance(node, ast.ClassDef) and node.name == "Env":
            for item in node.body:
                if getattr(item, "name", "") == "wait_idle":
                    item.args.args.pop()
    stub.body = [
        n for n in stub.body if not (isinstance(n, ast.AnnAssign) and n.target.id == "MAX_BUCKETS")
    ]
    problems = _differences(exposed, _declared(stub.body, in_class=False))
    assert problems == [
        "_core.MAX_BUCKETS (attribute) is not declared in _core.pyi",
        "_core.Env.wait_idle takes 1 parameters, declared with 0",
        "_core.Transaction.commit (method) is not declared in _core.pyi",
    ]
