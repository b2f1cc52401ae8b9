"""The application the worker groups of bench_postgresql.py run
(``percolite worker pg_app:app`` from bench/): hot keys summed by a combine
queue with the native ``sum``, as in bench_loader.py."""

import percolite

app = percolite.App("pg-hot")
hot = app.combine_queue("hot", buckets=16, combiner="sum")
