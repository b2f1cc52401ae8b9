"""The operations console: a live view of a store and its app, in a browser
or in a notebook.

``percolite ui DB`` serves it from the command line (``percolite worker ...
--ui-port N`` from a worker group); :class:`Console` serves it from Python;
:func:`show` shows it inside Jupyter. What it shows, all read from the store
(so the work of every process): the store and the worker groups with their
leases; each observer and queue with its pending work, rates, failures and
parked work; time series of the last minutes; the app's dataflow graph,
with edges learned from the runs; sink states; failures with their
tracebacks; and a read-only cell browser. Its actions: retry parked work,
take a refused sink over. The JSON API under ``/api/`` that the page uses
is documented in docs/operations.md.
"""

from __future__ import annotations

from typing import Any

from ._server import DEFAULT_HOST, DEFAULT_PORT, Console

__all__ = ["Console", "DEFAULT_HOST", "DEFAULT_PORT", "show"]


def show(env: Any, *, height: int = 720, port: int = 0) -> Any:
    """Shows the live console of ``env``'s store inside a Jupyter notebook:
    starts a :class:`Console` on 127.0.0.1 (``port=0``: a free port) serving
    from a daemon thread, and returns an IPython ``IFrame`` of it, ``height``
    pixels high. The console keeps serving while the kernel runs; the
    returned frame's ``console`` attribute stops it (``.console.close()``).

    Raises ImportError when IPython is not installed (this is for
    notebooks)."""
    try:
        from IPython.display import IFrame
    except ImportError:
        raise ImportError(
            "percolite.ui.show needs IPython (it draws into a notebook): run it in "
            "Jupyter, or serve the console with `percolite ui DB` instead"
        ) from None
    if isinstance(height, bool) or not isinstance(height, int) or height < 100:
        raise ValueError(f"height must be a number of pixels of at least 100, not {height!r}")
    console = Console(env, port=port).start()
    frame = IFrame(console.url, width="100%", height=height)
    frame.console = console  # type: ignore[attr-defined]
    return frame
