"""A frozen run (``fairkv reproduce --frozen``, what CI re-renders the committed results with) computes nothing: a
missing row, a stale row or timings of another plan stop it at once with an error naming what and the fix
(issue 49)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from fairkv.core import paths
from fairkv.runs import runner, runtime
from fairkv.runs.store import ResultsStore, StoreError
from fairkv.studies import runtime as runtime_study


@dataclass
class Counting:
    """A job of three cells whose computing is counted (a row is its cell id and a value)."""

    versions: dict = field(default_factory=lambda: {"code": "now"})
    computed: list = field(default_factory=list)

    def cells(self) -> dict:
        return {key: f"cell-{key}" for key in "abc"}

    def tasks(self, missing: list) -> list:
        return [missing]

    def compute(self, lm, tasks: list):
        for task in tasks:
            self.computed += task
            yield [{"cell_id": f"cell-{key}", "value": key, "versions": self.versions} for key in task]

    def load(self, device=None):  # no model runs: a float32 one on the CPU, as far as the rows' stamp asks
        return SimpleNamespace(model=SimpleNamespace(dtype=torch.float32), device=torch.device("cpu"), int8=False)

    def model_key(self) -> tuple:
        return ("none",)


def test_a_frozen_run_computes_no_missing_cell_and_names_it(tmp_path):
    store = ResultsStore(tmp_path / "rows.jsonl")
    store.append([{"cell_id": "cell-a", "value": "a", "versions": {"code": "now"}}])
    job = Counting()
    with paths.frozen_run(), pytest.raises(paths.FrozenError) as raised:
        runner.run(job, store, progress=False)
    message = str(raised.value)
    assert str(store.path) in message and "lacks 2 of the 3 cells" in message
    assert "cell-b, cell-c" in message and "without --frozen" in message
    assert job.computed == [] and not store.lock_path.exists()  # nothing computed, not even the lock taken
    assert not paths.frozen()  # the setting ends with the block
    assert set(runner.run(job, store, progress=False)) == {"cell-a", "cell-b", "cell-c"}
    assert job.computed == ["b", "c"]
    with paths.frozen_run():
        assert runner.run(Counting(), store, progress=False)["cell-c"]["value"] == "c"  # all stored: it renders


def test_a_frozen_run_stops_at_a_stale_row(tmp_path):
    store = ResultsStore(tmp_path / "rows.jsonl")
    store.append([{"cell_id": f"cell-{key}", "value": key, "versions": {"code": "then"}} for key in "abc"])
    with (
        paths.frozen_run(),
        pytest.raises(
            StoreError, match=r"rows.jsonl holds cell cell-\w of this job computed with code then \(now now\)"
        ),
    ):
        runner.run(Counting(), store, progress=False)


def test_frozen_timings_are_read_never_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRKV_RESULTS_DIR", str(tmp_path))
    chosen = runtime_study.STUDY.plan("ci")
    with paths.frozen_run(), pytest.raises(paths.FrozenError, match=r"timings of .* are not stored in .*runtime_"):
        runtime.timings(chosen, "ci", progress=False)


def test_the_frozen_setting_reaches_a_child_process():
    """The notebooks' kernels are child processes: they inherit the setting from ``fairkv reproduce --frozen``."""
    probe = "from fairkv.core import paths; print(paths.frozen())"
    run = lambda: subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    with paths.frozen_run():
        assert run().strip() == "True"
    assert run().strip() == "False"
