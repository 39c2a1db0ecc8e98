"""Memory of a process that runs sweep after sweep (a notebook kernel): one shared model, freed pages returned."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from fairkv.core import data
from fairkv.runs import executors, experiment, fingerprint


def job(**fields) -> experiment.Job:
    grid = experiment.Grid(
        **{"n_prompts": 1, "policies": ("streamingllm",), "ratios": (0.0, 0.5), "queries": ("keep",), **fields}
    )
    return experiment.Job(grid, (), None, data.load_defense_templates(), grid.attacks(), fingerprint.versions())


@pytest.fixture()
def loads(smollm, monkeypatch) -> list:
    """Every model load of ``experiment.Job`` (each returns the session's SmolLM2), from an empty shared slot."""
    calls = []
    monkeypatch.setattr(executors, "_SHARED", {})
    monkeypatch.setattr(experiment.Job, "load", lambda self, device=None: calls.append(self.grid) or smollm)
    return calls


def test_serial_runs_of_one_process_share_one_model(loads, tmp_path):
    """Notebook 11 runs eight sweeps in one kernel: the model is loaded once, not once per sweep."""
    experiment.run(job(start=0).grid, tmp_path, progress=False)
    experiment.run(job(start=1, ratios=(0.0, 0.7)).grid, tmp_path, progress=False)
    assert len(loads) == 1


def test_another_model_or_precision_replaces_the_shared_one(loads):
    first = executors.shared_model(job(), None)
    assert executors.shared_model(job(start=3), None) is first and len(loads) == 1
    executors.shared_model(job(dtype="bfloat16"), None)
    assert len(loads) == 2 and [key[2] for key in executors._SHARED] == ["bfloat16"]  # one model held, never two


def resident() -> int:
    """This process's resident bytes (Linux: /proc/self/statm)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's; elsewhere a no-op")
def test_freed_heap_pages_go_back_to_the_system():
    """Small tensors freed with every tenth kept alive leave holes glibc keeps for reuse; releasing returns them."""
    tensors = [torch.ones(16 * 1024) for _ in range(4000)]  # 64 KiB each, 250 MiB: below mmap's threshold, on the heap
    kept = tensors[::10]
    del tensors
    before = resident()
    executors.release_memory()
    after = resident()
    assert before - after > 150 * 2**20, f"{(before - after) / 2**20:.0f} MiB returned"
    assert len(kept) == 400
