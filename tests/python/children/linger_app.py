"""One combine queue whose bucket lingers 600 s: the worker process of
test_combine_queue_processes.py's hurry test runs it
(``percolite worker children.linger_app:app``)."""

from __future__ import annotations

import percolite

app = percolite.App("linger")
hot = app.combine_queue("hot", buckets=1, linger=600)
