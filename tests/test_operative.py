"""The defense's operative words (issue 51, item 2): the whitelist phrase's keep rate per cell
(``fairkv.runs.operative``), measured from the kept sets the sweep's attack answers decoded from, and what notebook 06
reads from it (``fairkv.studies.operative``)."""

from __future__ import annotations

import pandas as pd
import pytest

from fairkv.core import prompts
from fairkv.core.paths import REPO_ROOT
from fairkv.report import analysis
from fairkv.runs import experiment, operative, verify
from fairkv.runs.store import ResultsStore
from fairkv.studies import fair
from fairkv.studies import operative as study


def _grid(**chosen) -> experiment.Grid:
    settings = dict(
        model="smollm2-135m",
        n_prompts=2,
        policies=("streamingllm", "snapkv"),
        variants=("base", "whitelist", "fair"),
        ratios=(0.0, 0.5),
        queries=("attack",),
        max_new_tokens=8,
    )
    return experiment.Grid(**{**settings, **chosen})


def test_the_phrase_is_a_contiguous_span_of_the_defense(normal_prompt):
    phrase = operative.phrase(normal_prompt)
    defense = next(s for s in normal_prompt.spans if s.name == "defense")
    assert defense.start < phrase.start < phrase.end < defense.end  # in the middle of the defense
    assert len(phrase) == len(normal_prompt.protected)


def test_a_prompt_without_the_phrase_is_an_error_naming_it(smollm, records, templates):
    bare = prompts.paper_prompt(smollm.tokenizer, records[0], templates, "normal", "no_defense")
    with pytest.raises(operative.OperativeError, match="no whitelist phrase"):
        operative.phrase(bare)


def test_a_press_built_per_setting_is_refused():
    with pytest.raises(operative.OperativeError, match="built per setting"):
        operative.check(_grid(policies=("random",)))


def test_keep_rates_of_the_phrase_on_a_real_model(smollm, tmp_path):
    """On SmolLM2: the whitelist keeps the whole phrase, r = 0 keeps everything, fair StreamingLLM (each span's tail)
    keeps less of the phrase than of its defense; the spans' keep rates equal the sweep's rows of the same cells (the
    join checks them), and verify recomputes the rows identically."""
    grid = _grid()
    kept = operative.run(grid, tmp_path, progress=False, lm=smollm)
    assert len(kept) == 2 * 2 * 3 * 2 and kept["cell_id"].nunique() == 2 * (1 + 2 * 3)
    assert (kept.loc[kept["variant"] == "whitelist", "keep_operative"] == 1.0).all()
    assert (kept.loc[kept["ratio"] == 0.0, "keep_operative"] == 1.0).all()
    tail = kept[(kept["policy"] == "streamingllm") & (kept["variant"] == "fair") & (kept["ratio"] == 0.5)]
    assert (tail["keep_operative"] < tail["keep_defense"] - 0.2).all()
    rows = experiment.run(grid, tmp_path, progress=False, lm=smollm)
    assert study.joined(rows, kept)["keep_operative"].notna().all()
    store = operative.store_path(grid, tmp_path)
    assert verify.kind_of(store, list(ResultsStore(store).rows().values())) is verify.OPERATIVE
    report = verify.verify(store, sample=3, progress=False)
    assert report.identical == 3 and not report.differing


def test_joined_refuses_missing_cells_and_other_kept_sets():
    keys = dict(key=1, order="normal", policy="snapkv", variant="fair", lam=1.0, ratio=0.5)
    rows = pd.DataFrame([{**keys, "query": "attack", "keep_defense": 0.5, "keep_directive": 0.5}])
    kept = pd.DataFrame([{**keys, "keep_defense": 0.5, "keep_directive": 0.5, "keep_operative": 0.2}])
    assert study.joined(rows, kept)["keep_operative"].tolist() == [0.2]
    with pytest.raises(study.OperativeStudyError, match="1 attack cells have no operative keep rate"):
        study.joined(rows, kept.assign(ratio=0.7))
    with pytest.raises(study.OperativeStudyError, match="differ from the sweep's by up to 0.1"):
        study.joined(rows, kept.assign(keep_defense=0.6))


def test_buckets_close_at_one():
    keep = pd.Series([0.0, 0.249, 0.25, 0.5, 0.74, 0.75, 1.0])
    assert study.bucket_of(keep).tolist() == [
        "[0, 0.25)",
        "[0, 0.25)",
        "[0.25, 0.5)",
        "[0.5, 0.75)",
        "[0.5, 0.75)",
        "[0.75, 1]",
        "[0.75, 1]",
    ]


@pytest.fixture(scope="module")
def committed():
    """Notebook 06's committed cpu rows, both orders, each attack row with its phrase's keep rate (read, never
    computed)."""
    folder = REPO_ROOT / "results" / "cpu"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAIRKV_FROZEN", "1")
        patch.setenv("FAIRKV_RESULTS_DIR", str(folder.parent))
        rows = [declared.run("cpu", folder=folder, progress=False)[1] for declared in (fair.STUDY, fair.FLIPPED)]
        kept = study.measure("cpu", progress=False)
    return pd.concat([study.joined(analysis.with_benign_flags(r), kept) for r in rows], ignore_index=True)


def test_on_the_committed_rows_the_refusal_follows_the_operative_words(committed):
    """Every committed attack cell of notebook 06 has its phrase's keep rate, from the kept sets its answer decoded
    from (the join checks the spans' keep rates equal); the refusal rises with the phrase's keep rate, bucket by
    bucket; fair StreamingLLM raises the defense's keep rate at r = 0.5 but keeps none of the phrase, and in the flipped
    order drops the phrase the base kept (0.96 -> 0.00) with the refusal (1.00 -> 0.00)."""
    buckets = study.refusal_by_bucket(committed)
    both = buckets[buckets["order"] == "both"]["attack refused"].tolist()
    assert len(both) == 4 and both == sorted(both) and both[0] < 0.2 and both[-1] > 0.9
    assert study.follows(committed).low > 0.5
    table = study.cells(committed)
    assert (table.loc[table["variant"] == "whitelist", "keep_operative"] == 1.0).all()
    lost = study.lost_words(table)
    assert any(line.startswith("StreamingLLM (normal order) at r = 0.5, 0.6, 0.7") for line in lost)
    (dropped,) = study.dropped_words(table)
    assert dropped.startswith("StreamingLLM (flipped order) at r = 0.5")
    assert "operative words 0.96 -> 0.00, attack refused 1.00 -> 0.00" in dropped
