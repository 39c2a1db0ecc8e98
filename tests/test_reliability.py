"""Reliability: sweeps killed with SIGKILL resume without loss or duplicates; reruns are identical; results of other
library versions are reported, not mixed in; the quickstart runs with the network unavailable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sweeps import GRID, complete_lines, stable, sweep

from fairkv.core import progress
from fairkv.core.paths import REPO_ROOT
from fairkv.runs import experiment
from fairkv.runs.store import StoreError


def _until(condition, process: subprocess.Popen) -> None:
    """Wait for an event of the child's (no deadline: a loaded machine only makes it later); a child that ends first
    is caught by the caller's check of how it ended."""
    while not condition() and process.poll() is None:
        time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_at_several_points_then_resume_equals_an_uninterrupted_run(smollm, tmp_path, monkeypatch):
    """Each kill waits on an event of the child's, never on the clock: the compute lock taken (the model loading, no
    row yet), the first and second groups' rows landed, and a group's work begun, its rows not landed (the child
    reports "prefilling prompt ..." through ``FAIRKV_PROGRESS_FILE`` as a group starts; should that report come and go
    between two looks, the group's rows landing, with a group still to compute)."""
    grid = experiment.Grid(**GRID)
    experiment.run(grid, tmp_path / "clean", progress=False, lm=smollm)  # the uninterrupted run, in this process
    killed = experiment.store_for(grid, tmp_path / "killed")
    store = killed.path
    rows = lambda at_least: lambda process: len(complete_lines(store)) >= at_least
    locked = lambda process: (holder := killed.holder()) is not None and holder.pid == process.pid
    sink = tmp_path / "progress"  # progress.note writes what runs now to <sink>.doing, a Bar removes it as rows land
    landed = []  # the rows stored when the mid-group child started: a group landed after it is the latest kill
    prefilling = lambda process: Path(f"{sink}.doing").exists() or len(complete_lines(store)) > landed[-1]
    for point in (locked, rows(10), rows(20), prefilling):
        if point is prefilling:
            monkeypatch.setenv(progress.PROGRESS_SETTING, str(sink))
        landed.append(len(complete_lines(store)))
        process = sweep(tmp_path / "killed")
        _until(lambda: point(process), process)
        process.send_signal(signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL, "the sweep ended before the kill"
        lines = complete_lines(store)
        assert len(lines) == len({json.loads(line)["cell_id"] for line in lines}), "a duplicate row after a kill"
    monkeypatch.delenv(progress.PROGRESS_SETTING)
    finished = sweep(tmp_path / "killed")
    assert finished.wait(timeout=600) == 0, finished.stderr.read().decode()
    lines = complete_lines(store)
    clean = complete_lines(experiment.store_for(grid, tmp_path / "clean").path)
    assert len(lines) == len(clean) == len({json.loads(line)["cell_id"] for line in lines})  # none lost, none twice
    killed_rows = experiment.run(grid, tmp_path / "killed", progress=False, lm=None)
    clean_rows = experiment.run(grid, tmp_path / "clean", progress=False, lm=None)
    assert stable(killed_rows) == stable(clean_rows)


def test_same_grid_twice_gives_identical_rows(smollm, tmp_path):
    grid = experiment.Grid(**{**GRID, "n_prompts": 2})
    first = experiment.run(grid, tmp_path / "a", progress=False, lm=smollm)
    second = experiment.run(grid, tmp_path / "b", progress=False, lm=smollm)
    assert stable(first) == stable(second)
    versions = first["versions"].iloc[0]
    assert set(versions) >= {"fairkv", "metrics", "torch", "transformers", "kvpress", "lm-eval"}
    assert first["checksum"].iloc[0] == smollm.checksum and smollm.checksum is not None


@pytest.mark.parametrize("field, value", [("torch", "1.0.0"), ("code", "0123456789ab")])
def test_rows_of_other_versions_are_reported_not_mixed(smollm, tmp_path, field, value):
    """A row of another library version, or computed by other result code (its fingerprint), is never replayed."""
    grid = experiment.Grid(**{**GRID, "n_prompts": 1, "policies": ("streamingllm",), "variants": ("base",)})
    experiment.run(grid, tmp_path, progress=False, lm=smollm)
    path = experiment.store_for(grid, tmp_path).path
    rows = [json.loads(line) for line in complete_lines(path)]
    rows[0]["versions"][field] = value
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(
        StoreError, match=rf"{field} {value.replace('.', '[.]')} \(now .*\).*not mixed.*FAIRKV_RESULTS_DIR"
    ):
        experiment.run(grid, tmp_path, progress=False, lm=smollm)


# Loaded into every Python process of the run (the notebook kernel included): any connection that leaves the
# machine raises and is logged.
BLOCK_NETWORK = textwrap.dedent("""
    import os, socket
    _log = os.environ["FAIRKV_NETWORK_LOG"]
    _connect = socket.socket.connect
    def _guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("127.0.0.1", "::1", "localhost") and not host.startswith("/"):
            with open(_log, "a") as handle:
                handle.write(f"{host}\\n")
            raise OSError(f"network disabled by the test: {host}")
        return _connect(self, address)
    socket.socket.connect = _guarded
""")


@pytest.mark.slow
def test_quickstart_runs_with_the_network_unavailable(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK_NETWORK)
    log = tmp_path / "network.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "site"),
        "FAIRKV_NETWORK_LOG": str(log),
        "FAIRKV_REPORTS_DIR": str(tmp_path / "reports"),
        "FAIRKV_FIGURES_DIR": str(tmp_path / "figures"),
        "FAIRKV_RESULTS_DIR": str(tmp_path / "results"),
    }
    env.pop("HF_HUB_OFFLINE", None)  # the embedded path must not need the flag to stay offline
    done = subprocess.run(
        # the whole path (model, data, kernel, figures) on one policy and two ratios
        [
            sys.executable,
            "-m",
            "fairkv.cli",
            "reproduce",
            "00",
            "-p",
            "profile",
            "ci",
            "-p",
            "policies",
            "[streamingllm]",
            "-p",
            "ratios",
            "[0.0, 0.5]",
            "-p",
            "max_new_tokens",
            "8",
        ],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not log.exists(), f"tried the network: {log.read_text()}"
    assert (tmp_path / "reports" / "ci" / "00_quickstart.ipynb").exists()
    assert (tmp_path / "figures" / "ci" / "00_quickstart_leakage.png").exists()
