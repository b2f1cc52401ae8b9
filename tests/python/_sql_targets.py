"""The SQL exporters' tests run each behaviour against SQLite and against
PostgreSQL: these make exporters on a file of the test's tmp dir or on the
session's real server (``_postgres.py``), and query what they wrote."""

from __future__ import annotations

import itertools
import sqlite3
from contextlib import closing

import percolite.exporters

TABLE_NUMBERS = itertools.count()


class SQLiteTarget:
    """Makes SQLite exporters on one file of the test's tmp dir."""

    kind = "sqlite"

    def __init__(self, tmp_path):
        self.location = str(tmp_path / "export.sqlite")
        self.made = []

    def table_name(self, table):
        return table

    def exporter(self, table="t", **options):
        exporter = percolite.exporters.SQLite(self.location, table, **options)
        self.made.append(exporter)
        return exporter

    def sql(self, query, params=()):
        with closing(sqlite3.connect(self.location)) as conn, conn:
            return conn.execute(query, params).fetchall()

    def column_types(self, table):
        return {row[1]: row[2] for row in self.sql(f'PRAGMA table_info("{table}")')}


class PostgresTarget:
    """Makes Postgres exporters on the session's server, with table names
    unique to the test."""

    kind = "postgres"

    def __init__(self, dsn):
        self.location = dsn
        self.prefix = f"t{next(TABLE_NUMBERS)}"
        self.made = []

    def table_name(self, table):
        return f"{self.prefix}_{table}"

    def exporter(self, table="t", **options):
        name = self.table_name(table)
        exporter = percolite.exporters.Postgres(self.location, name, **options)
        self.made.append(exporter)
        return exporter

    def sql(self, query, params=()):
        import psycopg

        with psycopg.connect(self.location) as conn:
            cursor = conn.execute(query.replace("?", "%s"), params)
            return cursor.fetchall() if cursor.description else []

    def column_types(self, table):
        query = (
            "SELECT column_name, upper(data_type) FROM information_schema.columns"
            " WHERE table_name = ?"
        )
        return dict(self.sql(query, (table,)))
