"""Progress bars for long operations, drawn by tqdm (``tqdm.auto``: a widget
in notebooks, a bar on terminals) when it is installed (``pip install
percolite[progress]``); without it, operations run without a bar.

``enabled`` is True, False, or ``"auto"``: a bar when the stream is a
terminal or the code runs in a notebook kernel.
"""

from __future__ import annotations

import sys
from typing import Any

from ._args import check_progress

__all__ = ["Progress", "available"]


def available() -> bool:
    """Whether tqdm is installed, so that bars can be drawn."""
    try:
        import tqdm.auto  # noqa: F401
    except ImportError:
        return False
    return True


def _wanted(enabled: Any, stream: Any) -> bool:
    check_progress(enabled)
    if enabled == "auto":
        in_notebook = "ipykernel" in sys.modules
        return in_notebook or (hasattr(stream, "isatty") and stream.isatty())
    return bool(enabled)


class Progress:
    """One bar labelled ``label``. Either it counts work done up
    (:meth:`advance`), or it follows a count of work left as it falls
    (:meth:`remaining`: the bar's total grows when more work arrives)."""

    def __init__(
        self, label: str, enabled: Any = "auto", stream: Any = None, unit: str = "it"
    ) -> None:
        self.stream = stream or sys.stderr
        self.label = label
        self.unit = unit
        self.bar: Any = None
        self.enabled = _wanted(enabled, self.stream) and available()
        self.done = 0

    def _open(self, total: int | None) -> Any:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total, desc=self.label, unit=self.unit, file=self.stream, leave=True
            )
        return self.bar

    def advance(self, n: int = 1, **postfix: Any) -> None:
        """``n`` more done; ``postfix`` shows beside the bar."""
        if not self.enabled:
            return
        bar = self._open(None)
        bar.update(n)
        if postfix:
            bar.set_postfix(postfix, refresh=False)

    def note(self, text: str) -> None:
        """``text`` shows beside the bar (empty: nothing), until the next note."""
        if not self.enabled:
            return
        self._open(None).set_postfix_str(text, refresh=False)

    def remaining(self, left: int) -> None:
        """``left`` is what remains now: the bar shows what was done since the
        first call, out of everything seen."""
        if not self.enabled:
            return
        bar = self._open(left)
        total = max(bar.total or 0, self.done + left)
        if total != bar.total:
            bar.total = total
        done = total - left
        if done > self.done:
            bar.update(done - self.done)
            self.done = done
        else:
            bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
