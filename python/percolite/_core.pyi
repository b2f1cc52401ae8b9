# Type stub of the private extension module percolite._core (cpp/bindings/module.cc).
# tests/python/test_core_stub.py fails when a bound name is missing here.
from collections.abc import Callable, Iterable, Sequence
from typing import Any

_Bytes = bytes | str | bytearray | memoryview
_Column = tuple[_Bytes, _Bytes]
# An observer spec for Env.set_observers: (family, qualifier, kind, name,
# runner(core_tx, row, family, qualifier) -> (ok, traceback), or a queue).
_ObserverSpec = tuple[
    _Bytes, _Bytes, int, str, Callable[..., tuple[bool, Any]] | CombineQueue | ExportQueue
]

# Limits, layout facts and defaults of the core.
SEQ_INDEX_BITS: int
MAX_BUCKETS: int
MAX_LINGER_SECONDS: float
NOTIFY_STRONG: int
NOTIFY_WEAK: int
SYNC_MODES: tuple[str, ...]
NATIVE_COMBINERS: tuple[str, ...]
DEFAULT_FILE_MODE: int
DEFAULT_MAP_SIZE: int
DEFAULT_MAX_READERS: int
DEFAULT_THREADS: int
DEFAULT_RETRY_INITIAL: float
DEFAULT_RETRY_MAX: float
DEFAULT_COMBINE_BUCKETS: int
DEFAULT_BUFFER_SIZE: int
DEFAULT_BATCH_SIZE: int
BACKENDS: tuple[str, ...]

class Env:
    @staticmethod
    def open(
        path: str,
        sync: str,
        create: bool,
        mode: int,
        map_size: int,
        max_readers: int,
        backend: str = "",
    ) -> Env: ...
    def begin(self) -> Transaction: ...
    def close(self) -> None: ...
    def set_observers(self, specs: list[_ObserverSpec]) -> None: ...
    def start_workers(
        self,
        threads: int,
        worker_index: int,
        worker_count: int,
        retry_initial: float,
        retry_max: float,
    ) -> None: ...
    def stop_workers(self) -> None: ...
    def wait_idle(self, timeout: float) -> bool: ...
    def worker_stats(self) -> dict[str, Any]: ...
    def observed_columns(self) -> list[tuple[bytes, bytes, str, str]]: ...
    def pending_notifications(self) -> int: ...
    def pending_by_column(self) -> dict[tuple[bytes, bytes], int]: ...
    def scan_notifications(
        self, after: bytes, limit: int
    ) -> list[tuple[bytes, bytes, bytes, int, bytes]]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def path(self) -> str: ...
    @property
    def capabilities(self) -> dict[str, Any]: ...
    def stats(self) -> dict[str, int]: ...

class Transaction:
    @property
    def start_ts(self) -> int: ...
    @property
    def commit_ts(self) -> int | None: ...
    @property
    def state(self) -> str: ...
    def get(self, row: _Bytes, column: _Column) -> bytes | None: ...
    def get_many(self, cells: Iterable[tuple[_Bytes, _Column]]) -> list[bytes | None]: ...
    def set(self, row: _Bytes, column: _Column, value: _Bytes) -> None: ...
    def delete(self, row: _Bytes, column: _Column) -> None: ...
    def set_weak_notification(self, row: _Bytes, column: _Column) -> None: ...
    def scan_chunk(
        self,
        prefix: _Bytes | None,
        start: _Bytes | None,
        end: _Bytes | None,
        columns: Sequence[_Column] | None,
        resume_after: bytes | None,
        limit: int,
    ) -> tuple[list[tuple[bytes, bytes, bytes, bytes]], bytes, bool]: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...

class CombineQueue:
    @staticmethod
    def create(
        id: str,
        buckets: int,
        buffer_size: int,
        combiner: str | Callable[[bytes, list[bytes]], tuple[bool, Any]],
        value_type: str,
        tuple_length: int,
        on_change: Callable[
            [Transaction, list[tuple[bytes, bytes | None, bytes | None]]], tuple[bool, Any]
        ]
        | None,
        export_to: list[ExportQueue] = ...,
        linger: float = 0.0,
    ) -> CombineQueue: ...
    def add(self, tx: Transaction, updates: list[tuple[bytes, bytes]]) -> None: ...
    def get(self, tx: Transaction, key: bytes) -> bytes | None: ...
    def bucket_of(self, key: bytes) -> int: ...
    def add_native(
        self,
        tx: Transaction,
        updates: object,
        key_codec: tuple[str, int],
        value_codec: tuple[str, int],
    ) -> bool: ...
    def data_row_prefix(self, bucket: int) -> bytes: ...
    @property
    def notify_column(self) -> tuple[bytes, bytes, str]: ...

class ExportQueue:
    @staticmethod
    def create(
        id: str,
        buckets: int,
        batch_size: int,
        exporter: Callable[[list[Any]], tuple[bool, Any]],
        entry_type: Callable[[Any, Any, int], Any] | None = None,
        key_codec: tuple[str, int] | None = None,
        value_codec: tuple[str, int] | None = None,
        linger: float = 0.0,
    ) -> ExportQueue: ...
    def add(self, tx: Transaction, key: bytes, value: bytes) -> None: ...
    def bucket_of(self, key: bytes) -> int: ...
    @property
    def entry_row_prefix(self) -> bytes: ...
    @property
    def notify_column(self) -> tuple[bytes, bytes, str]: ...
