"""An append-only results store: one JSON object per line, written atomically, safe to kill at any moment.

Each row carries a ``cell_id`` (a hash of everything that determines it) and the store's ``schema``. Appends take an
exclusive lock, write whole lines in one call and fsync, so two notebooks can share a store and a killed run leaves
at most one unterminated last line: that line is never read back as a row, and the next append removes it. Rows
written under another schema are reported, never mixed in.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Iterable

SCHEMA = 1


class StoreError(RuntimeError):
    """The store holds rows this version of fairkv cannot use."""


class ResultsStore:
    """Rows keyed by ``cell_id`` in a JSONL file."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _complete_lines(self, data: bytes) -> tuple[list[bytes], int]:
        """The newline-terminated lines and the byte length they span (a partial tail is excluded)."""
        end = data.rfind(b"\n") + 1
        return data[:end].splitlines(), end

    def rows(self) -> dict[str, dict]:
        """Every complete row by cell id (the last one wins if a cell was written twice)."""
        if not self.path.exists():
            return {}
        lines, _ = self._complete_lines(self.path.read_bytes())
        rows = {}
        for number, line in enumerate(lines, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise StoreError(f"{self.path}, line {number}: corrupt row ({error.msg})") from error
            if row.get("schema") != SCHEMA:
                raise StoreError(
                    f"{self.path}, line {number}: written with results schema {row.get('schema')}, this fairkv reads "
                    f"schema {SCHEMA}; move the file away or use another results folder"
                )
            rows[row["cell_id"]] = row
        return rows

    def append(self, rows: Iterable[dict]) -> list[dict]:
        """Append rows atomically (one write under an exclusive lock, then fsync); return them as stored."""
        stored = [{**row, "schema": SCHEMA} for row in rows]
        payload = b"".join((json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n").encode() for row in stored)
        if not payload:
            return stored
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.seek(0)
                _, end = self._complete_lines(handle.read())
                if handle.tell() != end:  # an unterminated tail from a killed writer: drop it
                    handle.truncate(end)
                os.write(handle.fileno(), payload)
                os.fsync(handle.fileno())
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return stored
