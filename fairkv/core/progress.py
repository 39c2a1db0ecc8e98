"""Progress of long loops, in the notebook and in the terminal that runs it.

``Bar`` is a tqdm bar (shown in the notebook or the terminal that runs the loop) that writes its state (what, done,
total, elapsed, ETA) to the file named by ``FAIRKV_PROGRESS_FILE`` instead when that is set. ``fairkv reproduce`` sets
it for the kernel papermill starts and shows the state in its own terminal (``Monitor``): papermill alone shows only
which cell runs, and one cell of a sweep can run for an hour.

The ETA counts only the work done in this run: rows read back from the results store are in ``done`` but not in the
rate. Between two updates of a bar (a task of a sweep can take many minutes), ``note`` says what runs now (which
prompt is prefilled, which decoding step), shown after the bar's state.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

PROGRESS_SETTING = "FAIRKV_PROGRESS_FILE"
REPORT_EVERY_S = 1.0
_noted = 0.0  # when ``note`` last wrote


def _doing_file(sink: str) -> Path:
    return Path(sink + ".doing")


def note(text: str) -> None:
    """Say what runs now, at most once a second; nothing when no terminal watches (``FAIRKV_PROGRESS_FILE`` unset),
    or where the file cannot be written (a Ray worker on another node)."""
    global _noted
    sink = os.environ.get(PROGRESS_SETTING)
    if not sink or time.monotonic() - _noted < REPORT_EVERY_S:
        return
    _noted = time.monotonic()
    try:
        _doing_file(sink).write_text(text)
    except OSError:
        pass


class Bar(tqdm):
    """A tqdm bar that reports to ``FAIRKV_PROGRESS_FILE`` instead when that is set (a terminal shows the progress,
    and the saved notebook keeps no bar); advance it with ``update`` (also when disabled)."""

    def __init__(self, total: int, desc: str, initial: int = 0, disable: bool = False, **kwargs):
        sink = os.environ.get(PROGRESS_SETTING)
        super().__init__(total=total, desc=desc, initial=initial, disable=disable or bool(sink), **kwargs)
        self._sink = sink
        self._what, self._total, self._done, self._first = desc, total, initial, initial
        self._started = time.monotonic()
        self._reported = 0.0
        self._report(force=True)

    def update(self, n: int = 1):
        out = super().update(n)
        self._done += n
        self._report(force=self._done >= self._total)
        return out

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._sink or (not force and now - self._reported < REPORT_EVERY_S):
            return
        self._reported = now
        _doing_file(self._sink).unlink(missing_ok=True)  # what ran until now is done
        elapsed, computed = now - self._started, self._done - self._first
        eta = (self._total - self._done) * elapsed / computed if computed else None
        state = {"what": self._what, "done": self._done, "total": self._total, "elapsed_s": elapsed, "eta_s": eta}
        path = Path(self._sink)
        staging = path.with_name(path.name + ".tmp")
        staging.write_text(json.dumps(state))
        os.replace(staging, path)  # the reader never sees half a state


def duration(seconds: float) -> str:
    """``"42 s"``, ``"12 min 3 s"``, ``"2 h 5 min"``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def describe(state: dict | None, elapsed: float, doing: str | None = None) -> str:
    """One status line: the loop's rows done / total and ETA (or only the notebook's elapsed time), and what runs."""
    line = f"{duration(elapsed)} elapsed"
    if state:
        share = state["done"] / state["total"] if state["total"] else 1.0
        eta = "ETA " + duration(state["eta_s"]) if state["eta_s"] is not None else "ETA after the first rows"
        line += f" | {state['what']} {state['done']}/{state['total']} ({share:.0%}), {eta}"
    return line + (f" | now: {doing}" if doing else "")


class Monitor:
    """Shows what a notebook's loops report while papermill runs it: a line rewritten in place on a terminal, a new
    line every ``every_s`` seconds (and when a loop finishes) otherwise."""

    def __init__(self, path: Path, stream=None, every_s: float = 60.0, poll_s: float = 1.0):
        self.path, self.stream, self.every_s, self.poll_s = Path(path), stream or sys.stdout, every_s, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> "Monitor":
        self.path.unlink(missing_ok=True)
        _doing_file(str(self.path)).unlink(missing_ok=True)
        os.environ[PROGRESS_SETTING] = str(self.path)
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        os.environ.pop(PROGRESS_SETTING, None)
        if self.stream.isatty():
            self.stream.write("\r\033[K")
        self.path.unlink(missing_ok=True)
        _doing_file(str(self.path)).unlink(missing_ok=True)

    def state(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def doing(self) -> str | None:
        try:
            return _doing_file(str(self.path)).read_text() or None
        except OSError:
            return None

    def _watch(self) -> None:
        live, printed_at, printed = self.stream.isatty(), 0.0, None
        while True:
            stopping = self._stop.wait(self.poll_s)
            state = self.state()
            line = describe(state, time.monotonic() - self._started, self.doing())
            if live:
                self.stream.write("\r\033[K  " + line)
            elif time.monotonic() - printed_at >= self.every_s or (
                state != printed and (stopping or (state is not None and state["done"] >= state["total"]))
            ):
                self.stream.write("  " + line + "\n")  # a minute passed, a loop finished, or the notebook ended
                printed_at, printed = time.monotonic(), state
            self.stream.flush()
            if stopping:
                return
