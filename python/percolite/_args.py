"""Checks of arguments that many parts of percolite take: one wording for
each mistake, whichever call made it.

Each check raises TypeError for a value of the wrong type and ValueError
for one out of range, naming the argument; checks of one object's own
options (a queue's buckets, a counter's shards) stay with that object.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from . import _core

__all__ = [
    "check_bool",
    "check_file_mode",
    "check_int",
    "check_max_attempts",
    "check_parent_directory",
    "check_positive_seconds",
    "check_progress",
    "check_retry_options",
    "check_timeout",
]


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> None:
    """An int argument (TypeError otherwise, bools too) in [low, high]
    (ValueError); ``low`` and ``high`` None for no bound on that side."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if low is None:
        return
    if high is None and value < low:
        raise ValueError(f"{name} must be >= {low}, not {value}")
    if high is not None and not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high:,}, not {value:,}")


def check_bool(name: str, value: Any) -> None:
    """TypeError unless ``value`` is True or False (not merely truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")


def check_timeout(timeout: Any) -> float | None:
    """``timeout`` checked: a number of seconds >= 0, or None (or infinity)
    for no limit; TypeError or ValueError naming it otherwise."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number or None, not {type(timeout).__name__}")
    if not timeout >= 0:  # NaN too
        raise ValueError(f"timeout must be >= 0 or None, not {timeout}")
    return None if timeout == float("inf") else float(timeout)


def check_retry_options(retries_name: str, retries: Any, backoff: Any, max_backoff: Any) -> None:
    """The retry options of :meth:`Env.run` and :class:`Loader`, checked:
    ``retries`` an int >= 0 or None; ``backoff`` and ``max_backoff`` finite
    numbers >= 0. TypeError or ValueError naming the option."""
    if retries is not None:
        if not isinstance(retries, int) or isinstance(retries, bool):
            raise TypeError(f"{retries_name} must be an int or None, not {type(retries).__name__}")
        if retries < 0:
            raise ValueError(f"{retries_name} must be >= 0 or None, not {retries}")
    for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"{name} must be a number, not {type(value).__name__}")
        if not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, not {value}")


def check_max_attempts(max_attempts: Any, what: str) -> int:
    """The core's form of ``max_attempts`` (0 for None: retry forever);
    TypeError or ValueError naming ``what`` for anything but None or an int
    from 1 to the core's limit."""
    if max_attempts is None:
        return 0
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError(
            f"{what}: max_attempts must be an int >= 1 or None (retry forever), "
            f"not {type(max_attempts).__name__}"
        )
    if not 1 <= max_attempts <= _core.MAX_ATTEMPTS_LIMIT:
        raise ValueError(
            f"{what}: max_attempts must be between 1 and {_core.MAX_ATTEMPTS_LIMIT} "
            f"(or None: retry forever), not {max_attempts}"
        )
    return max_attempts


def check_progress(enabled: Any) -> None:
    """ValueError unless ``enabled`` is True, False or ``"auto"``."""
    if not isinstance(enabled, bool) and enabled != "auto":
        raise ValueError(f"progress must be True, False or 'auto', not {enabled!r}")


def check_positive_seconds(number: Any, name: str) -> float:
    """``number`` of seconds, checked: ValueError naming ``name`` unless it
    is an int or float > 0."""
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {number!r}")
    return number


def check_file_mode(mode: Any) -> int:
    """``mode`` checked: an int permission mask from 0 to 0o777."""
    if isinstance(mode, bool) or not isinstance(mode, int):
        raise TypeError(f"mode must be an int permission mask, not {type(mode).__name__}")
    if not 0 <= mode <= 0o777:
        raise ValueError(f"mode must be a permission mask between 0 and 0o777, not {mode:#o}")
    return mode


def check_parent_directory(path: str) -> None:
    """FileNotFoundError unless the directory that would hold ``path`` exists."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            errno.ENOENT, f"the directory {directory!r} of {path!r} does not exist", path
        )
