"""Code the tests run in other processes, kept as importable, linted modules
(pytest collects none of them: none is named ``test_*.py``).

``children.<topic>``, named after the test module ``test_<topic>.py`` that uses
it, holds functions that each run alone in a fresh interpreter. A test imports
the module and passes the function itself::

    import children.combine_queue
    import children.concurrency

    out = run_child(children.concurrency.shared_transaction, store_path, timeout=60)
    report = run_child_json(children.combine_queue.hammer, db=..., nkeys=3000)

``_isolated.run_child`` names the function by its module and name
(``"children.concurrency:shared_transaction"``), starts ``python -c`` with
``tests/python`` first on ``sys.path`` and calls :func:`main` here, which
imports the module anew and calls the function with the test's arguments; a
function not defined at the top level of such a module cannot be imported
there, so ``run_child`` refuses it. Arguments travel on the command line
as Python literals (``repr`` there, ``ast.literal_eval`` here), so tuples,
bytes and nested containers arrive as they were; paths arrive as ``str``. A
function reports by printing: the test reads its stdout, and the ``_json``
helpers read the JSON on its last line. The interpreter exits once the
function returns, and its locals are gone by then: a function that must
leave an object alive until the exit (workers still running, say) keeps it
in a module global.

``children.<name>_app`` modules define a ``percolite.App`` named ``app`` for
worker processes: the CLI loads them as ``children.<name>_app:app`` with
``tests/python`` as its working directory, and tests bind a fresh copy of the
same module in their own process with ``_isolated.load_fresh``. Variations
(a sleep, a failure rate, a sink) come from environment variables, read when
the module is imported.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import os

__all__ = ["POSTGRES_VARIABLE", "main", "open_store", "store_target"]

# A postgresql:// URI: the server postgresql stores of the tests live on (set
# by the tests' ``backend`` fixture when it starts one, and inherited here).
POSTGRES_VARIABLE = "PERCOLITE_TEST_POSTGRES"


def main(argv: list) -> None:
    """Call ``argv[0]`` (``"package.module:function"``) with the arguments
    ``argv[1]`` holds: the literal ``(args, kwargs)``."""
    target, literal = argv
    module_name, _, function_name = target.partition(":")
    args, kwargs = ast.literal_eval(literal)
    function = getattr(importlib.import_module(module_name), function_name)
    function(*args, **kwargs)


def store_target(backend: str, path):
    """Where a store of ``backend`` for a test is: ``path`` for lmdb,
    ``":memory:"`` (a new private store each time), or, for postgresql, a
    schema on the tests' server named after ``path``, so that the same path
    names the same store in every process."""
    if backend == "memory":
        return ":memory:"
    if backend != "postgresql":
        return path
    uri = os.environ[POSTGRES_VARIABLE]
    digest = hashlib.sha256(os.fsencode(os.fspath(path))).hexdigest()[:24]
    return f"{uri}{'&' if '?' in uri else '?'}schema=t_{digest}"


def open_store(backend: str, path, **options):
    """Open the store of ``backend`` that ``store_target`` names, in this process."""
    import percolite

    return percolite.open(store_target(backend, path), backend=backend, **options)
