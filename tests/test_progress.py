"""Progress a person can follow: loops report rows done / total and an ETA to the terminal of `fairkv reproduce`."""

from __future__ import annotations

import io
import json
import time

import fairkv.studies
from fairkv import cli
from fairkv.core import progress
from fairkv.report.notebooks import numbered


def test_bar_reports_done_total_and_eta(tmp_path, monkeypatch):
    sink = tmp_path / "state.json"
    monkeypatch.setenv(progress.PROGRESS_SETTING, str(sink))
    monkeypatch.setattr(progress, "REPORT_EVERY_S", 0.0)
    bar = progress.Bar(total=10, desc="rows", initial=4, disable=True)  # 4 rows read back from the store
    assert json.loads(sink.read_text()) | {"elapsed_s": 0} == {
        "what": "rows",
        "done": 4,
        "total": 10,
        "elapsed_s": 0,
        "eta_s": None,
    }
    time.sleep(0.05)
    bar.update(3)
    state = json.loads(sink.read_text())
    assert (state["done"], state["total"]) == (7, 10)
    # the rate counts this run's 3 rows only: 3 more rows take as long as the 3 done
    assert abs(state["eta_s"] - state["elapsed_s"]) < 0.01 and state["eta_s"] >= 0.05


def test_a_watched_bar_draws_nothing(tmp_path, monkeypatch):
    """Where a terminal watches (``fairkv reproduce`` sets the progress file), the bar reports there and draws
    nothing in the notebook, so a saved notebook keeps no progress bar; unwatched, it draws as tqdm does."""
    drawn = io.StringIO()
    monkeypatch.setenv(progress.PROGRESS_SETTING, str(tmp_path / "state.json"))
    progress.Bar(total=2, desc="rows", file=drawn).update(2)
    assert drawn.getvalue() == "" and json.loads((tmp_path / "state.json").read_text())["done"] == 2
    monkeypatch.delenv(progress.PROGRESS_SETTING)
    progress.Bar(total=2, desc="rows", file=drawn).update(2)
    assert "rows: 100%" in drawn.getvalue()


def _printed(stream: io.StringIO, text: str) -> None:
    """Wait until the monitor's thread has printed ``text`` (it looks every 0.01 s: a minute without it is a monitor
    that does not print, not a slow machine)."""
    started = time.monotonic()
    while text not in stream.getvalue():
        assert time.monotonic() - started < 60, f"never printed: {text!r} in {stream.getvalue()!r}"
        time.sleep(0.01)


def test_monitor_prints_the_state_and_the_end(tmp_path):
    """The finished state printed by the monitor's thread while it runs, and not again when it stops."""
    stream = io.StringIO()  # not a terminal: whole lines
    with progress.Monitor(tmp_path / "state.json", stream, every_s=3600, poll_s=0.01):
        bar = progress.Bar(total=4, desc="rows", disable=True)
        bar.update(4)
        _printed(stream, "rows 4/4 (100%)")
    lines = stream.getvalue().splitlines()
    finished = [line for line in lines if line.endswith(" elapsed | rows 4/4 (100%), ETA 0 s")]
    assert len(finished) == 1 and lines[-1] == finished[0], lines  # printed when it finished, not again at the end
    assert not (tmp_path / "state.json").exists() and progress.PROGRESS_SETTING not in __import__("os").environ


def test_a_note_says_what_runs_between_two_updates(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "_noted", 0.0)
    stream = io.StringIO()
    with progress.Monitor(tmp_path / "state.json", stream, every_s=0.05, poll_s=0.01):
        bar = progress.Bar(total=3, desc="rows", disable=True)
        progress.note("decoding 24 of 24 answers, token 7 of at most 96")
        _printed(
            stream, "| rows 0/3 (0%), ETA after the first rows | now: decoding 24 of 24 answers, token 7 of at most 96"
        )
        bar.update(3)  # the rows landed: the note is done with
        _printed(stream, "| rows 3/3 (100%), ETA 0 s")
    assert stream.getvalue().splitlines()[-1].endswith("| rows 3/3 (100%), ETA 0 s")


def test_describe_and_duration():
    assert progress.duration(42) == "42 s" and progress.duration(723) == "12 min 3 s"
    assert progress.duration(7500) == "2 h 5 min"
    state = {"what": "rows", "done": 120, "total": 480, "elapsed_s": 60.0, "eta_s": 180.0}
    assert progress.describe(state, 75.0) == "1 min 15 s elapsed | rows 120/480 (25%), ETA 3 min 0 s"
    assert progress.describe(None, 5.0) == "5 s elapsed"


def test_reproduce_says_how_long_before_it_starts():
    notebooks = numbered()
    _, minutes = fairkv.studies.expected_minutes("cpu", [nb.name[:2] for nb in notebooks])
    assert cli.expected_time("cpu", notebooks).startswith(
        f"estimated on a 2-core machine for the cpu profile: about {sum(minutes.values())} min"
    )
    third = fairkv.studies.module("03").MINUTES["cpu"]
    assert f"about {third} min from an empty results store (03: {third} min" in cli.expected_time("cpu", notebooks[3:4])
    assert "about 1 min from an empty results store (03: 0.8 min" in cli.expected_time("ci", notebooks[3:4])
    assert "the paper profile needs a GPU" in cli.expected_time("paper", notebooks)
