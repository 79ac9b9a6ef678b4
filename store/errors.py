"""Why a store cannot be used as asked: its errors, and how a damaged file is told apart."""

from __future__ import annotations

from pathlib import Path

import duckdb

from servewatch.store.holder import Holder


class StoreError(Exception):
    """The store file cannot be used as asked."""


class SchemaTooNewError(StoreError):
    """The file was written by a newer servewatch whose schema this version does not know."""


class StorePathError(StoreError):
    """The path cannot hold a store file: a folder, or below a regular file."""


class StoreMissingError(StorePathError):
    """No store at the path, and the caller asked not to create one."""


class StoreBusyError(StoreError):
    """Another process holds the store file (DuckDB lets one process write, or several read);
    `holder` says which, and where its API answers, when it left a note."""

    def __init__(self, message: str, *, holder: Holder | None) -> None:
        super().__init__(message)
        self.holder = holder


class StoreDamagedError(StoreError):
    """The file is not a DuckDB store, or parts of it cannot be read back."""


# What DuckDB says of a file that is not a database, cut short, or overwritten in places.
_DAMAGE_MARKERS = ("not a valid duckdb database", "could not read enough bytes", "corrupt")


# A DuckDB file starts with three 4 KiB headers; its blocks follow.
FILE_HEADER_BYTES = 3 * 4096


DAMAGED_ADVICE = "restore it from a backup, or pass another --db"


def damage_error(location: str, exc: BaseException) -> StoreDamagedError | None:
    """The error to show when `exc` is DuckDB saying the store file is damaged; None for
    anything else, so callers outside the store need not know DuckDB's exceptions."""
    if not isinstance(exc, duckdb.Error):
        return None
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not any(marker in detail.lower() for marker in _DAMAGE_MARKERS):
        return None
    return StoreDamagedError(
        f"store {location} is damaged or not a DuckDB store ({detail}); {DAMAGED_ADVICE}"
    )


def check_location(path: Path, *, create: bool) -> None:
    """Refuse a path that cannot be a store file; make its folders when creating."""
    if path.is_dir():
        raise StorePathError(f"store {path}: is a folder, not a store file")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise StorePathError(f"store {path}: {parent} is a file, not a folder")
            break
    if path.exists():
        return
    if not create:
        raise StoreMissingError(f"no store at {path}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorePathError(
            f"store {path}: cannot create {path.parent}: {exc.strerror or exc}"
        ) from exc
