"""The README's example, annotated as a user with a type checker writes it (its
queues declared with codec objects, which type their keys and values): it must
pass `mypy --strict` against the installed package (scripts/check-types.sh, CI)."""

import sqlite3
import tempfile

import percolite
from percolite.codecs import INT64, STR, Codec
from percolite.exporters import SQLite

work = tempfile.mkdtemp()
app = percolite.App()
words = app.combine_queue("words", combiner="sum", key_codec=STR, value_codec=INT64)
out = app.export_queue(
    "out", SQLite(f"{work}/out.sqlite", "counts", key="word", columns="n"), value_codec=INT64
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


# Codec names keep working: the queue is typed with Any, so nothing is refused.
by_name = app.combine_queue("by_name", key_codec="bytes", value_codec="float64")


@app.export_queue("late", value_codec="json")
def late(entries: list[percolite.SequencedExport]) -> None:
    pass


def add_by_name(tx: percolite.Transaction) -> None:
    by_name.add(tx, {b"k": 1.5})
    late.add(tx, "k", {"any": ["json"]})


class Point(Codec[tuple[int, int]]):
    """A codec of the user's own: its type parameter types the queue."""

    name = "point"

    def encode(self, value: tuple[int, int]) -> bytes:
        return f"{value[0]},{value[1]}".encode()

    def decode(self, data: bytes) -> tuple[int, int]:
        x, y = data.decode().split(",")
        return int(x), int(y)


points = app.combine_queue("points", combiner="last", key_codec=Point(), value_codec=STR)


def latest(tx: percolite.Transaction) -> dict[tuple[int, int], str]:
    points.add(tx, {(1, 2): "here"})
    return dict(points.scan(tx))


def declared(a: percolite.App) -> list[str]:
    """The app's declaration, read through its public views."""
    kinds = [str(queue.layout["kind"]) for queue in a.queues.values()]
    return kinds + [o.name for o in a.observers] + [str(a.revision)]
