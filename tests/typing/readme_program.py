"""The README's example, annotated as a user with a type checker writes it: it must
pass `mypy --strict` against the installed package (scripts/check-types.sh, CI)."""

import sqlite3
import tempfile

import percolite
from percolite.exporters import SQLite

work = tempfile.mkdtemp()
app = percolite.App()
words = app.combine_queue("words", combiner="sum")
out = app.export_queue(
    "out", SQLite(f"{work}/out.sqlite", "counts", key="word", columns="n"), value_codec="int64"
)


@words.on_change
def export(tx: percolite.Transaction, changes: list[percolite.Change[str, int]]) -> None:
    for change in changes:
        out.add(tx, change.key, change.new)


@app.observer(("doc", "text"))
def index(tx: percolite.Transaction, row: bytes, column: percolite.Column) -> None:
    text = tx.get(row, column)
    if text is not None:
        words.add(tx, {w: 1 for w in text.decode().split()})


def load(text: str) -> None:
    with percolite.open(f"{work}/db", app=app) as env:
        env.run(lambda tx: words.add(tx, {w: 1 for w in text.split()}))
        env.process()
        with env.transaction() as tx:
            total: int | None = words.get(tx, "to")
            pairs: list[tuple[str, int]] = list(words.scan(tx))
            print(total, pairs)


load("to be or not to be")
rows: list[tuple[str, int]] = (
    sqlite3.connect(f"{work}/out.sqlite")
    .execute("SELECT word, n FROM counts ORDER BY n DESC, word")
    .fetchall()
)
print(rows)


def counted(tx: percolite.Transaction) -> int:
    """A default makes get's result non-optional."""
    return words.get(tx, "to", 0) + 1


@words.on_change
def observed(tx: percolite.ObserverTransaction, changes: list[percolite.Change[str, int]]) -> int:
    """The transaction handlers really get, and a result that is ignored."""
    return len(changes)
