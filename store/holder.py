"""Who holds a store: the note a long-running writer (`servewatch run`) leaves beside the file.

DuckDB locks a store file to one process while it writes, and a reader in another process is
then refused outright. The note (`<store>.holder.json`) says which process holds the file and
where its local API answers, so a reading command can ask the holder instead of failing. A
note whose process is gone is ignored (a writer that crashed leaves one behind).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

HOLDER_SUFFIX = ".holder.json"


@dataclass(frozen=True)
class Holder:
    """A process holding a store, and where its API answers (None: it serves none)."""

    pid: int
    command: str
    api_url: str | None


def holder_path(store_path: Path | str) -> Path:
    return Path(f"{store_path}{HOLDER_SUFFIX}")


def write_holder(store_path: Path | str, holder: Holder) -> Path:
    """Leave the note; written whole, then moved into place, so a reader never sees half."""
    path = holder_path(store_path)
    staged = path.with_name(f".{path.name}.{holder.pid}")
    staged.write_text(
        json.dumps({"pid": holder.pid, "command": holder.command, "api_url": holder.api_url}),
        encoding="utf-8",
    )
    staged.replace(path)
    return path


def remove_holder(store_path: Path | str, *, pid: int) -> None:
    """Remove the note if it is this process's own."""
    found = read_holder(store_path, check_alive=False)
    if found is not None and found.pid == pid:
        holder_path(store_path).unlink(missing_ok=True)


def read_holder(store_path: Path | str, *, check_alive: bool = True) -> Holder | None:
    """The note's holder; None without a note, with an unreadable one, or (by default) when
    its process no longer runs."""
    try:
        raw = json.loads(holder_path(store_path).read_text(encoding="utf-8"))
        holder = Holder(
            pid=int(raw["pid"]),
            command=str(raw["command"]),
            api_url=None if raw.get("api_url") is None else str(raw["api_url"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if check_alive and not _alive(holder.pid):
        return None
    return holder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True
