"""The numbers that carry the science at the ci scale, compared by pytest with tolerances (the notebooks at
``-p profile ci`` compute them too, but SmolLM2 follows too little for most of their printed numbers to mean
anything): the keep rates of notebook 04 (the mechanism of Fig 7) and of the quickstart's record. The refusal lost
under compression and kept by the whitelist (notebooks 03, 05) is checked on Qwen in ``test_compliance.py``.

The pinned values are SmolLM2's in float32 on this repository's machine; the tolerance absorbs arithmetic of another
CPU, not a change of selection (one token of a 49-token span moves a keep rate by 0.02)."""

from __future__ import annotations

import pytest

from fairkv.core import data, prompts, score_once
from fairkv.core.presses import PAPER, Setting, rates
from fairkv.studies import keep_rates

pytestmark = pytest.mark.model

# notebook 04 at the ci profile (8 prompts of sys_ifeval_shuffled), r = 0.5: mean (defense, directive) keep rates
KEEP_AT_HALF = {
    ("normal", "streamingllm"): (0.293, 1.000),
    ("normal", "h2o"): (0.341, 0.886),
    ("normal", "snapkv"): (0.301, 0.984),
    ("normal", "tova"): (0.343, 0.884),
    ("normal", "knorm"): (0.541, 0.391),
    ("flipped", "streamingllm"): (0.685, 0.077),
    ("flipped", "h2o"): (0.542, 0.403),
    ("flipped", "snapkv"): (0.557, 0.371),
    ("flipped", "tova"): (0.405, 0.718),
    ("flipped", "knorm"): (0.512, 0.463),
}
# the quickstart's record (key 1001, normal order: 124 defense tokens, then 49 directive tokens)
QUICKSTART = {
    ("streamingllm", 0.5): (0.298, 1.000),
    ("streamingllm", 0.75): (0.032, 0.796),
    ("h2o", 0.5): (0.341, 0.891),
    ("snapkv", 0.5): (0.302, 0.992),
    ("tova", 0.5): (0.340, 0.895),
    ("knorm", 0.5): (0.522, 0.435),
    ("knorm", 0.75): (0.262, 0.215),
}
TOLERANCE = 0.02


@pytest.fixture(scope="module")
def keep_rows():
    """Notebook 04's rows at the ci profile, in the run's ci results store (``make test`` gives each run a fresh
    one), as notebook 04 at ``-p profile ci`` computes them."""
    return keep_rates.STUDY.run("ci", progress=False)[1]


def test_notebook_04_keep_rates(keep_rows):
    at_half = (
        keep_rows[keep_rows["ratio"] == 0.5].groupby(["order", "policy"])[["keep_defense", "keep_directive"]].mean()
    )
    moved = {
        cell: (round(at_half.loc[cell, "keep_defense"], 3), round(at_half.loc[cell, "keep_directive"], 3), expected)
        for cell, expected in KEEP_AT_HALF.items()
        if at_half.loc[cell].tolist() != pytest.approx(expected, abs=TOLERANCE)
    }
    assert not moved, f"(defense, directive, pinned) moved: {moved}"


def test_position_bias_follows_the_order(keep_rows):
    """Fig 7 / 10: StreamingLLM, SnapKV and H2O keep the later span better at every r > 0 and the bias reverses when
    the order flips; the earlier span's keep rate falls as r grows."""
    mean = (
        keep_rows[keep_rows["ratio"] > 0]
        .groupby(["policy", "order", "ratio"])[["keep_defense", "keep_directive"]]
        .mean()
    )
    for policy in ("streamingllm", "snapkv", "h2o"):
        normal, flipped = mean.loc[(policy, "normal")], mean.loc[(policy, "flipped")]
        assert (normal["keep_directive"] >= normal["keep_defense"]).all(), policy  # defense first: evicted first
        assert (flipped["keep_defense"] >= flipped["keep_directive"]).all(), policy  # directive first: evicted first
        assert normal["keep_defense"].is_monotonic_decreasing and flipped["keep_directive"].is_monotonic_decreasing


def test_quickstart_record_keep_rates(smollm):
    record = data.get_record(data.load_sys_ifeval("sys_ifeval"), 1001)
    prompt = prompts.paper_prompt(smollm.tokenizer, record, data.load_defense_templates(), order="normal")
    assert [(s.name, len(s)) for s in prompt.spans] == [("defense", 124), ("directive", 49)]
    prefilled = score_once.prefill(smollm, prompt, PAPER)
    for (policy, ratio), expected in QUICKSTART.items():
        keep = rates.keep_rates(
            score_once.cut(prefilled, Setting(policy, ratio=ratio)).kept, prompt.spans, prompt.n_tokens
        )
        assert (keep["defense"], keep["directive"]) == pytest.approx(expected, abs=TOLERANCE), (policy, ratio)
