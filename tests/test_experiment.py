"""Sweeps into the results store: computed once, resumable after a crash, identical when rerun."""

from __future__ import annotations

import json

import pytest

from fairkv.core import score_once
from fairkv.runs import experiment, studies
from fairkv.core.presses import Setting, canonical
from fairkv.runs.experiment import GridError
from fairkv.runs.store import ResultsStore, StoreError


def tiny(**overrides) -> experiment.Grid:
    base = dict(
        n_prompts=3,
        policies=("streamingllm", "snapkv"),
        variants=("base", "fair"),
        lams=(0.0, 1.0),
        ratios=(0.0, 0.5),
        max_new_tokens=8,
    )
    return experiment.Grid(**{**base, **overrides})


def comparable(frame):
    columns = ["key", "order", "policy", "variant", "lam", "ratio", "query", "response", "keep_defense", "cell_id"]
    return frame[columns].to_dict("records")


def test_canonical_settings():
    assert canonical("snapkv", "fair", 1.0, 0.0) == Setting(None, "base", 1.0, 0.0)
    assert canonical("snapkv", "fair", 0.0, 0.5) == Setting("snapkv", "base", 1.0, 0.5)
    assert canonical("snapkv", "fair+whitelist", 0.0, 0.5) == Setting("snapkv", "whitelist", 1.0, 0.5)
    assert canonical("snapkv", "whitelist", 0.3, 0.5) == Setting("snapkv", "whitelist", 1.0, 0.5)
    # r = 0 once, then 2 policies x (base, fair lam 1) at r = 0.5 (fair lam 0 is the base)
    assert len(tiny().settings()) == 1 + 2 * 2


def test_rerun_computes_nothing_and_returns_the_same(smollm, tmp_path, monkeypatch):
    grid = tiny()
    first = experiment.run(grid, tmp_path, progress=False, lm=smollm)
    assert len(first) == 3 * 2 * 3 * 2 * 2  # prompts x policies x (base, fair 0, fair 1) x ratios x queries
    monkeypatch.setattr(score_once, "prefill", lambda *a, **k: pytest.fail("a finished cell was computed again"))
    second = experiment.run(grid, tmp_path, progress=False, lm=smollm)
    assert comparable(first) == comparable(second)
    r0 = first[first["ratio"] == 0.0]
    assert r0["cell_id"].nunique() == 3 * 2  # r = 0 computed once per prompt and query, shared by all labels


def test_crash_and_resume_equals_an_uninterrupted_run(smollm, tmp_path, monkeypatch):
    grid = tiny(batch_size=5)
    reference = experiment.run(grid, tmp_path / "clean", progress=False, lm=smollm)
    compute = experiment.Job.compute

    def crash_after_the_first_rows(self, lm, tasks):
        for number, rows in enumerate(compute(self, lm, tasks)):
            if number == 1:
                raise KeyboardInterrupt("killed")
            yield rows

    monkeypatch.setattr(experiment.Job, "compute", crash_after_the_first_rows)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(grid, tmp_path / "crashed", progress=False, lm=smollm)
    store = experiment.store_for(grid, tmp_path / "crashed")
    assert 0 < len(store.rows()) < reference["cell_id"].nunique()  # the rows that landed before the kill stay
    with open(store.path, "ab") as handle:  # a writer killed mid-line leaves half a row behind
        handle.write(b'{"cell_id": "half-written", "respo')
    assert "half-written" not in store.rows()
    monkeypatch.setattr(experiment.Job, "compute", compute)
    resumed = experiment.run(grid, tmp_path / "crashed", progress=False, lm=smollm)
    assert comparable(resumed) == comparable(reference)
    lines = store.path.read_text().splitlines()
    assert len(lines) == len({json.loads(line)["cell_id"] for line in lines}) == len(store.rows())  # no duplicate


def test_store_rejects_another_schema(tmp_path):
    store = ResultsStore(tmp_path / "old.jsonl")
    store.path.write_text(json.dumps({"cell_id": "x", "schema": 0}) + "\n")
    with pytest.raises(StoreError, match="schema 0"):
        store.rows()


def test_profiles_and_bad_grids():
    assert studies.profile("ci").model == "smollm2-135m"
    assert studies.profile("cpu").model == "qwen2.5-coder-1.5b" and studies.profile("cpu").note
    assert studies.profile("ci", n_prompts=2).n_prompts == 2
    with pytest.raises(GridError, match="unknown profile"):
        studies.profile("laptop")
    with pytest.raises(GridError, match="unknown grid parameter"):
        studies.profile("ci", n_promts=2)
    with pytest.raises(GridError, match="unknown query kind"):
        tiny(queries=("benign", "jailbreak"))
    with pytest.raises(ValueError, match="outside"):
        tiny(ratios=(0.0, 1.0))


def test_keep_rows_decode_nothing_and_match_the_decoded_rows(smollm, tmp_path, monkeypatch):
    decoded = experiment.run(tiny(), tmp_path, progress=False, lm=smollm)
    # every decode goes through a Decoder's queue (broken on purpose: a keep row queued for decoding fails here)
    monkeypatch.setattr(experiment.generation.Decoder, "add", lambda *a, **k: pytest.fail("keep rows decoded"))
    kept = experiment.run(tiny(queries=("keep",)), tmp_path, progress=False, lm=smollm)
    assert set(kept["query"]) == {"keep"} and "response" not in kept
    columns = ["key", "policy", "variant", "lam", "ratio", "keep_defense", "keep_directive"]
    benign = decoded[decoded["query"] == "benign"][columns].reset_index(drop=True)
    assert kept[columns].reset_index(drop=True).equals(benign)  # same settings, same kept sets
    assert (kept["keep_defense"] < 1).any()
