"""An append-only results store: one JSON object per line, written atomically, safe to kill at any moment.

Each row carries a ``cell_id`` (a hash of everything that determines it) and the store's ``schema``. Appends take an
exclusive lock, write whole lines in one call and fsync, so a killed run leaves at most one unterminated last line:
that line is never read back as a row, and the next append removes it. Rows written under another schema are
reported, never mixed in.

At most one process computes a store's missing cells at a time (``computing``): a run that finds cells missing takes
the store's compute lock (``<store>.lock``, an flock held for the whole run, with the holder's PID, host and start
time written in it), so a second run on the same store waits for the first with a message naming it, then reuses
its rows instead of computing them again (or, with ``wait=False``, fails at once with that message). The kernel
releases an flock when its process dies, SIGKILL included, and nothing holds it after a power loss: a lock file left
with a dead holder's name in it is taken over, and said so, without anyone deleting files. On NFS, flock is carried
by the NFS lock manager; file systems whose locks do not reach other clients (SMB/CIFS, sshfs, 9p, object-store
mounts) are refused with an error naming the file system.

``check`` reports a store's lines, cells, duplicates and rows of other versions; ``compact`` rewrites it without
duplicates, atomically.

Rows that are to be committed (the cpu profile's, ``results/cpu/``) are sealed: ``seal`` moves the live file's rows into
gzip segments beside it (``<store>.part-NNNN.jsonl.gz``, each from at most ``SEGMENT_BYTES`` of rows, written
byte-for-byte reproducibly), under the same lock appends take, so a run may keep appending while its rows are sealed.
A store reads its segments in order, then the live file: the last row written for a cell wins, as before.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

SCHEMA = 1
SEGMENT_BYTES = 32 * 2**20  # rows (uncompressed) per sealed segment: about 3 MB of gzip, far under git hosts' limits
# file systems whose locks are not shared between the machines that mount them (or not implemented)
UNLOCKABLE_FILESYSTEMS = (
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "vboxsf",
    "fuse.sshfs",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.rclone",
    "fuse.goofys",
)


class StoreError(RuntimeError):
    """The store holds rows this version of fairkv cannot use, or cannot be locked."""


class StoreBusy(StoreError):
    """Another process is computing this store's missing cells (raised when asked not to wait)."""


def filesystem(path: Path, mounts: str | None = None) -> str:
    """The type of the file system holding ``path`` (the longest mount point above it in ``/proc/mounts``)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return "unknown"
    resolved, best, kind = str(Path(path).resolve()), "", "unknown"
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def check_lockable(folder: Path, mounts: str | None = None) -> None:
    kind = filesystem(folder, mounts)
    if kind in UNLOCKABLE_FILESYSTEMS:
        raise StoreError(
            f"the results folder {folder} is on a {kind} file system, whose file locks other machines do not see: "
            "two runs could compute the same cells. Put the results on a local disk or NFS (FAIRKV_RESULTS_DIR)"
        )


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a store's compute lock."""

    pid: int
    host: str
    started: str
    command: str

    @classmethod
    def me(cls) -> "Holder":
        return cls(os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S %Z"), " ".join(sys.argv)[:200])

    @classmethod
    def read(cls, text: str) -> "Holder | None":
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError):
            return None

    def __str__(self) -> str:
        return f"PID {self.pid} on {self.host}, started {self.started} ({self.command})"


class ResultsStore:
    """Rows keyed by ``cell_id`` in a JSONL file."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def _complete_lines(self, data: bytes) -> tuple[list[bytes], int]:
        """The newline-terminated lines and the byte length they span (a partial tail is excluded)."""
        end = data.rfind(b"\n") + 1
        return data[:end].splitlines(), end

    def segments(self) -> list[Path]:
        """The sealed segments (``<store>.part-NNNN.jsonl.gz``), in the order they were sealed."""
        return sorted(self.path.parent.glob(f"{self.path.stem}.part-[0-9][0-9][0-9][0-9].jsonl.gz"))

    def _parsed(self, lines: list[bytes], source: Path, schema: bool = False) -> list[dict]:
        """Rows of ``lines`` (read from ``source``); with ``schema``, a row of another schema is an error too."""
        out = []
        for number, line in enumerate(lines, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise StoreError(f"{source}, line {number}: corrupt row ({error.msg})") from error
            if schema and row.get("schema") != SCHEMA:
                raise StoreError(
                    f"{source}, line {number}: written with results schema {row.get('schema')}, this fairkv reads "
                    f"schema {SCHEMA}; move the file away or use another results folder"
                )
            out.append(row)
        return out

    def lines(self) -> tuple[list[dict], int]:
        """Every complete line as a dict, sealed segments first, then the live file in file order, and the bytes of
        the live file's unterminated tail (a killed writer's)."""
        return self._lines(schema=False)

    def _lines(self, schema: bool) -> tuple[list[dict], int]:
        sealed = []
        for segment in self.segments():
            sealed += self._parsed(gzip.decompress(segment.read_bytes()).splitlines(), segment, schema)
        live, tail = self._live(schema)
        return sealed + live, tail

    def _live(self, schema: bool = False) -> tuple[list[dict], int]:
        """The live file's complete rows and the bytes of its unterminated tail."""
        if not self.path.exists():
            return [], 0
        data = self.path.read_bytes()
        lines, end = self._complete_lines(data)
        return self._parsed(lines, self.path, schema), len(data) - end

    def rows(self) -> dict[str, dict]:
        """Every complete row by cell id (the last one wins if a cell was written twice); a row of another schema
        is an error naming its file and line."""
        return {row["cell_id"]: row for row in self._lines(schema=True)[0]}

    def seal(self) -> dict:
        """Move the live file's complete rows into new gzip segments (``SEGMENT_BYTES`` of rows each at most) and
        empty it, under the append lock: rows appended meanwhile wait for it and land in the emptied live file. A
        segment is complete on disk before the live file is emptied; gzip headers carry no time, so the same rows
        always give the same bytes."""
        if not self.path.exists():
            return {"path": str(self.path), "sealed_rows": 0, "segments": []}
        written = []
        with open(self.path, "r+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                lines, _ = self._complete_lines(handle.read())
                self._parsed(lines, self.path, schema=True)  # never seal a corrupt row or another schema's
                chunks, chunk, size = [], [], 0
                for line in lines:
                    if chunk and size + len(line) + 1 > SEGMENT_BYTES:
                        chunks.append(chunk)
                        chunk, size = [], 0
                    chunk.append(line)
                    size += len(line) + 1
                chunks += [chunk] if chunk else []
                number = int(self.segments()[-1].name.rsplit(".part-", 1)[1][:4]) + 1 if self.segments() else 0
                for offset, chunk in enumerate(chunks):
                    target = self.path.with_name(f"{self.path.stem}.part-{number + offset:04d}.jsonl.gz")
                    staging = target.with_name(target.name + ".sealing")
                    with open(staging, "wb") as out:
                        out.write(gzip.compress(b"".join(line + b"\n" for line in chunk), mtime=0))
                        out.flush()
                        os.fsync(out.fileno())
                    os.replace(staging, target)
                    written.append(target.name)
                handle.truncate(0)
                os.fsync(handle.fileno())
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return {"path": str(self.path), "sealed_rows": len(lines), "segments": written}

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

    def holder(self) -> Holder | None:
        """Who holds the compute lock now (None when nobody does)."""
        if not self.lock_path.exists():
            return None
        fd = os.open(self.lock_path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return Holder.read(self.lock_path.read_text()) or Holder(0, "?", "?", "unreadable lock file")
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    @contextmanager
    def computing(self, wait: bool = True, say=print):
        """Hold the store's compute lock for the block: wait for another holder (``say`` names it) or, with
        ``wait=False``, raise ``StoreBusy``; take over a lock whose holder died. Re-read the store inside the block:
        the previous holder's rows are there."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        check_lockable(self.path.parent)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = Holder.read(self.lock_path.read_text())
                message = f"{self.path} is being computed by {holder or 'another process'}"
                if not wait:
                    raise StoreBusy(
                        f"{message}; wait for it, or use another results folder (FAIRKV_RESULTS_DIR)"
                    ) from None
                say(f"{message}: waiting for it to finish, then its rows are reused (interrupt to stop waiting)")
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as error:
                raise StoreError(f"cannot lock {self.lock_path} ({error}): put the results on a local disk") from error
            previous = Holder.read(self.lock_path.read_text())
            if previous is not None:  # released without clearing its name: it died (SIGKILL, power loss)
                say(f"taking over the lock of {self.path} left by {previous}, which no longer runs")
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(Holder.me().__dict__).encode(), 0)
            os.fsync(fd)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)  # a clean release leaves no name behind
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def check(self, expected=None) -> dict:
        """Lines, unique cells, duplicate lines, an unterminated tail, rows of another schema and (given ``expected``,
        the versions a row must carry: ``fingerprint.expected``) rows computed under other versions; and who computes
        it now."""
        lines, tail = self.lines()
        cells = {row.get("cell_id") for row in lines}
        report = {
            "path": str(self.path),
            "lines": len(lines),
            "cells": len(cells),
            "duplicates": len(lines) - len(cells),
            "unterminated_tail_bytes": tail,
            "other_schema": sum(row.get("schema") != SCHEMA for row in lines),
        }
        if expected is not None:
            latest = {row.get("cell_id"): row for row in lines}.values()
            report["other_versions"] = sum("versions" in row and row["versions"] != expected(row) for row in latest)
        holder = self.holder()
        report["computing"] = str(holder) if holder else None
        return report

    def restamp(self, change) -> int:
        """Rewrite every row ``change`` (row -> row, or None to keep it) changes, in the sealed segments and the live
        file, each file written beside the old and replacing it once complete and on disk; rows it keeps keep their
        bytes, and a segment stays byte-for-byte reproducible. A run computing this store makes it fail
        (``StoreBusy``) rather than wait. Returns the number of rows changed."""
        changed = 0
        with self.computing(wait=False):
            for source in [*self.segments(), *([self.path] if self.path.exists() else [])]:
                sealed = source != self.path
                raw = gzip.decompress(source.read_bytes()) if sealed else source.read_bytes()
                lines, _ = self._complete_lines(raw)
                out = []
                for line, row in zip(lines, self._parsed(lines, source, schema=True)):
                    new = change(row)
                    changed += new is not None
                    out.append(line if new is None else json.dumps(new, sort_keys=True, ensure_ascii=False).encode())
                payload = b"".join(line + b"\n" for line in out)
                staging = source.with_name(source.name + ".restamping")
                with open(staging, "wb") as handle:
                    handle.write(gzip.compress(payload, mtime=0) if sealed else payload)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(staging, source)
        return changed

    def compact(self, say=print) -> dict:
        """Rewrite the store (its live file; sealed segments are never rewritten) with one line per cell (the last
        written wins, as for reading) and no unterminated tail. The new file is written beside the old and replaces
        it only once complete and on disk; a run computing this store makes it fail (``StoreBusy``) rather than
        wait."""
        with self.computing(wait=False, say=say):
            lines, tail = self._live()
            latest = {row.get("cell_id"): row for row in lines}
            staging = self.path.with_name(self.path.name + ".compacting")
            with open(staging, "wb") as handle:
                handle.writelines(
                    (json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n").encode() for row in latest.values()
                )
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(staging, self.path)
        return {
            "path": str(self.path),
            "lines_before": len(lines),
            "lines_after": len(latest),
            "removed_duplicates": len(lines) - len(latest),
            "removed_tail_bytes": tail,
        }
