"""Mistakes mypy --strict must catch in a program using percolite. Each
marked line is wrong; its `type: ignore[code]` comment silences exactly
that error, and --strict warns about an ignore that silences nothing, so
scripts/check-types.sh fails if a mistake stops being caught."""

import percolite
from percolite.codecs import FLOAT64, INT64, STR

app = percolite.App()
words = app.combine_queue("words", combiner="sum", key_codec=STR, value_codec=INT64)
out = app.export_queue("out", lambda entries: None, value_codec=INT64)


@app.export_queue("later", value_codec=INT64)
def later(entries: list[percolite.SequencedExport]) -> None:
    pass


app.combine_queue("n", value_codec=42)  # type: ignore[arg-type]
floats = app.combine_queue("floats", key_codec=STR, value_codec=FLOAT64)


@app.observer(("doc", "text"))  # type: ignore[type-var]
def too_few(tx: percolite.Transaction, row: bytes) -> None:
    pass


@words.on_change  # type: ignore[arg-type]
def wrong_value_type(
    tx: percolite.ObserverTransaction, changes: list[percolite.Change[str, str]]
) -> None:
    pass


def load(tx: percolite.Transaction, text: str) -> None:
    words.add(tx, {"a": "one"})  # type: ignore[arg-type]
    out.add(tx, "k", "not an int")  # type: ignore[arg-type]
    later.add(tx, "k", "not an int")  # type: ignore[arg-type]
    total = words.get(tx, "a")
    total + 1  # type: ignore[operator]
    floats.add(tx, [("a", "1.5")])  # type: ignore[list-item]
    app.queues["words"] = words  # type: ignore[index]
    value = tx.get("row", ("f", "q"))
    value + b"!"  # type: ignore[operator]


def with_loader(env: percolite.Env) -> None:
    with env.loader() as loader:
        loader.submit(load, 42)  # type: ignore[arg-type]
        loader.submit(load)  # type: ignore[call-arg]


percolite.open("db", sync="fulll")  # type: ignore[arg-type]
