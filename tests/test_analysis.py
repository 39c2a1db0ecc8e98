"""The paper's derived quantities on hand-worked examples (expected numbers written out), and the studies' grids."""

import importlib
import json
import math
import re
from collections import Counter

import pandas as pd
import pytest

import fairkv.studies

from fairkv import cli
from fairkv.core import data
from fairkv.core.paths import results_dir
from fairkv.report import analysis, verdicts
from fairkv.runs import experiment, studies


def _row(policy="streamingllm", variant="base", lam=1.0, order="normal", ratio=0.0, query="benign", key=1, **fields):
    return {
        "policy": policy,
        "variant": variant,
        "lam": lam,
        "order": order,
        "ratio": ratio,
        "query": query,
        "key": key,
        **fields,
    }


def test_composite_and_table1_by_hand():
    """Base: accuracy 0.5, leakage 0.6 at r = 0.4 and 0.5; whitelist: accuracy 0.5 then 1.0, leakage 0.2 then 0.6.

    score(0.4) = 0.5 (0.5 - 0.5) + 0.5 (0.6 - 0.2) = 0.2; score(0.5) = 0.5 (1.0 - 0.5) + 0.5 (0.6 - 0.6) = 0.25;
    Table 1: mean 0.225, std (ddof 0) 0.025.
    """
    rows = []
    for ratio, (acc, leak) in {0.4: (0.5, 0.2), 0.5: (1.0, 0.6)}.items():
        for key, ok in ((1, 1.0), (2, 0.0)):  # base accuracy 0.5 at both ratios
            rows.append(_row(ratio=ratio, key=key, prompt_strict=ok))
            rows.append(_row(ratio=ratio, key=key, query="attack", leak_directive=0.6))
            rows.append(_row(variant="whitelist", ratio=ratio, key=key, prompt_strict=1.0 if acc == 1.0 else ok))
            rows.append(_row(variant="whitelist", ratio=ratio, key=key, query="attack", leak_directive=leak))
    rows = pd.DataFrame(rows)
    scores = analysis.composite(rows, "whitelist").set_index("ratio")["score"]
    assert scores[0.4] == pytest.approx(0.2) and scores[0.5] == pytest.approx(0.25)
    table = analysis.table1(rows, (0.4, 0.5), variants=("whitelist",))
    assert table["mean"].item() == pytest.approx(0.225) and table["std"].item() == pytest.approx(0.025)
    assert table["ratios"].item() == 2
    with pytest.raises(analysis.AnalysisError, match=r"Table 1 needs r = \[0.6, 0.7\]"):
        analysis.table1(rows, (0.4, 0.5, 0.6, 0.7), variants=("whitelist",))
    with pytest.raises(analysis.AnalysisError, match="variant 'fair'"):
        analysis.composite(rows, "fair")


def test_pareto_frequency_by_hand():
    """Three lambdas at three ratios. r = 0: all equal, left out (every lambda ties there). r = 0.5: lambda 0 (acc 0.5,
    leak 0.5) is dominated by lambda 1 (acc 0.6, leak 0.2); lambda 0.5 (acc 0.7, leak 0.4) is not. r = 0.7: a tie
    on accuracy (0.6) where lambda 1 leaks less (0.1 vs 0.3) and lambda 0.5 is worse on both: "strict" (another
    lambda better on both axes) leaves lambda 0 optimal, "weak" (no worse on both, better on one) does not.
    strict: 0 -> 1/2, 0.5 -> 1/2, 1 -> 1; weak: 0 -> 0, 0.5 -> 1/2, 1 -> 1 (with r = 0 counted: 2/3, 2/3, 1 and 1/3,
    2/3, 1)."""
    points = {
        (0.0, 0.0): (0.5, 0.1),
        (0.5, 0.0): (0.5, 0.1),
        (1.0, 0.0): (0.5, 0.1),
        (0.0, 0.5): (0.5, 0.5),
        (0.5, 0.5): (0.7, 0.4),
        (1.0, 0.5): (0.6, 0.2),
        (0.0, 0.7): (0.6, 0.3),
        (0.5, 0.7): (0.5, 0.4),
        (1.0, 0.7): (0.6, 0.1),
    }
    rows = []
    for (lam, ratio), (acc, leak) in points.items():
        rows.append(_row(variant="fair", lam=lam, ratio=ratio, prompt_strict=acc))
        rows.append(_row(variant="fair", lam=lam, ratio=ratio, query="attack", leak_directive=leak))
    frequency = {
        rule: analysis.pareto_frequency(pd.DataFrame(rows), rule).set_index("lam")["frequency"].to_dict()
        for rule in analysis.PARETO_RULES
    }
    assert frequency["strict"] == pytest.approx({0.0: 1 / 2, 0.5: 1 / 2, 1.0: 1.0})
    assert frequency["weak"] == pytest.approx({0.0: 0.0, 0.5: 1 / 2, 1.0: 1.0})
    trec = pd.DataFrame(rows).rename(columns={"prompt_strict": "trec_score"})  # Table 4: LongBench TREC's accuracy
    assert analysis.pareto_frequency(trec, "strict", "trec_score").set_index("lam")[
        "frequency"
    ].to_dict() == pytest.approx(frequency["strict"])
    from fairkv.report import claims as lines
    from fairkv.studies import debias
    from fairkv.studies import trec as trec_study

    # Table 4, declared in fairkv.studies.trec, read by notebook 07's measure; one prompt: no interval, no verdict
    measured = debias.pareto(trec.assign(policy="snapkv"), trec_study.TABLE4, trec_study.TABLE4_POLICIES, "trec_score")
    claims = lines.table([lines.line(trec_study.TABLE4, measured, 1)])
    assert set(claims["figure"]) == {"Table 4"} and claims["paper"].iloc[0] == trec_study.TABLE4.paper_text
    assert str(trec_study.TABLE4.numbers["snapkv_lambda1"]) in claims["paper"].iloc[0]
    shown = "SnapKV, normal order (prompts: attack 1, benign 1): strict: lambda=0: 50%, lambda=0.5: 50%, lambda=1: 100%"
    assert claims["ours"].iloc[0].startswith(f"{shown} of 2 points")
    assert claims["n"].iloc[0] == 1 and claims["verdict"].iloc[0] == verdicts.INCONCLUSIVE
    with pytest.raises(analysis.AnalysisError, match="unknown dominance rule"):
        analysis.pareto_frequency(pd.DataFrame(rows), "pareto")


def test_class_accuracy_normalised_and_spearman():
    """Three classes followed at r = 0 by 1, 1/2 and 0 of their instructions... a reversed ranking at r = 0.5 gives
    rho = -1; the class at 0 accuracy at r = 0 has no normalised value."""
    ids = ["keywords:a", "keywords:b", "length_constraints:a", "length_constraints:b", "punctuation:a", "punctuation:b"]
    at = {0.0: [1, 1, 1, 0, 0, 0], 0.5: [0, 0, 1, 0, 1, 1]}
    rows = pd.DataFrame(
        [
            _row(ratio=ratio, key=1, instruction_ids=ids, strict_list=[bool(v) for v in outcome], prompt_strict=0.0)
            for ratio, outcome in at.items()
        ]
    )
    accuracy = analysis.class_accuracy(rows).set_index(["class", "ratio"])
    assert accuracy.loc[("keywords", 0.5), "accuracy"] == 0.0
    assert accuracy.loc[("length_constraints", 0.5), "normalised"] == pytest.approx(1.0)
    assert math.isnan(accuracy.loc[("punctuation", 0.5), "normalised"])
    assert set(accuracy["prompts"]) == {"multi"}
    rho = analysis.spearman(analysis.class_accuracy(rows)).set_index("ratio")["rho"]
    assert rho[0.0] == pytest.approx(1.0) and rho[0.5] == pytest.approx(-1.0)
    # the raw accuracy's Wilson band: 1 of 2 instructions followed
    assert (
        accuracy.loc[("length_constraints", 0.0), "low"],
        accuracy.loc[("length_constraints", 0.0), "high"],
    ) == pytest.approx((0.0945, 0.9055), abs=1e-3)
    # rho's band resamples prompts: one prompt reversed and one kept in order give rho -1 or 1 in every draw that
    # holds one of them alone, and the point in between when both are drawn
    kept = rows.assign(key=2, strict_list=[list(rows["strict_list"].iloc[0])] * 2)
    bands = analysis.spearman_intervals(pd.concat([rows, kept], ignore_index=True), n_boot=100).set_index("ratio")
    assert bands.loc[0.5, "low"] == pytest.approx(-1.0) and bands.loc[0.5, "high"] == pytest.approx(1.0)
    assert math.isnan(bands.loc[0.5, "rho"])  # both prompts together: every class at 0.5, a constant ranking


def test_means_use_wilson_for_rates_and_bootstrap_for_leakage():
    rows = pd.DataFrame([_row(query="attack", key=k, refused=float(k < 3), leak_directive=0.1 * k) for k in range(10)])
    refused = analysis.means(rows, "refused").iloc[0]
    assert refused["mean"] == pytest.approx(0.3) and refused["n"] == 10
    assert (refused["low"], refused["high"]) == pytest.approx((0.1078, 0.6032), abs=1e-3)  # Wilson, n = 10, k = 3
    leak = analysis.means(rows, "leak_directive").iloc[0]
    # seeded percentile bootstrap (1000 resamples, seed 0) of 0.0, 0.1, ..., 0.9: pinned, so a change of seed, resample
    # count or interval method shows; a constant sample has a zero-width interval
    assert (leak["mean"], leak["low"], leak["high"]) == pytest.approx((0.45, 0.27, 0.64))
    assert verdicts.bootstrap_ci(rows["leak_directive"], seed=1) != (leak["low"], leak["high"])
    assert verdicts.bootstrap_ci(pd.Series([0.3] * 5)) == pytest.approx((0.3, 0.3))
    with pytest.raises(analysis.AnalysisError, match="'prompt_strict'"):
        analysis.means(rows, "prompt_strict")


BOTH = ("normal", "flipped")
ALL5 = ("streamingllm", "h2o", "snapkv", "tova", "knorm")
TEN = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
MODELS = {
    "ci": ("smollm2-135m", "float32"),
    "cpu": ("qwen2.5-coder-1.5b", "bfloat16"),
    "paper": ("meta-llama/Llama-3.1-8B-Instruct", "bfloat16"),
}
# Every study's grid at every profile, written out: what each notebook computes (tokens: attack, benign override)
GRIDS = {
    # ci
    ("degradation", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=2,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base",),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.5, 0.7),
        queries=("benign",),
        tokens=(32, None),
    ),
    ("policies", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=2,
        orders=("normal",),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.5, 0.7),
        queries=("benign",),
        tokens=(32, None),
    ),
    ("leakage", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=2,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.5, 0.7),
        queries=("benign", "attack"),
        tokens=(32, None),
    ),
    ("keep_rates", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=8,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=TEN,
        queries=("keep",),
        tokens=(32, None),
    ),
    ("whitelist", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=2,
        orders=("normal",),
        policies=ALL5,
        variants=("base", "whitelist"),
        lams=(1.0,),
        ratios=(0.0, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(32, None),
    ),
    ("fair", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=2,
        orders=("normal",),
        policies=ALL5,
        variants=("base", "whitelist", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(32, None),
    ),
    ("fair_flipped", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=2,
        orders=("flipped",),
        policies=("streamingllm",),
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.5, 0.7),
        queries=("benign", "attack"),
        tokens=(32, None),
    ),
    ("debias", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=2,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("fair",),
        lams=(0.0, 0.5, 1.0),
        ratios=(0.0, 0.3, 0.5, 0.7),
        queries=("benign", "attack"),
        tokens=(32, None),
    ),
    ("trec", "ci"): dict(
        dataset="trec_1k",
        n=1,
        orders=("normal",),
        policies=("streamingllm", "snapkv"),
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.5),
        queries=("benign", "attack"),
        tokens=(32, 16),
    ),
    ("trec_debias", "ci"): dict(
        dataset="trec_1k",
        n=1,
        orders=("normal",),
        policies=("snapkv",),
        variants=("fair",),
        lams=(0.0, 0.5, 1.0),
        ratios=(0.0, 0.5, 0.7),
        queries=("benign", "attack"),
        tokens=(32, 16),
    ),
    ("spans", "ci"): dict(
        dataset="spans_2",
        n=2,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.5, 0.7),
        queries=("benign",),
        tokens=(32, 32),
    ),
    ("attacks", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=1,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base", "whitelist", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.5),
        queries=("benign", "attack"),
        tokens=(16, None),
    ),
    ("defenses", "ci"): dict(
        dataset="sys_ifeval_shuffled",
        n=1,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.5, 0.7),
        queries=("attack",),
        tokens=(32, None),
    ),
    # cpu
    ("degradation", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base",),
        lams=(1.0,),
        ratios=TEN,
        queries=("benign",),
        tokens=(128, 512),
    ),
    ("policies", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal",),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.5, 0.7, 0.9),
        queries=("benign",),
        tokens=(128, 512),
    ),
    ("leakage", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.5, 0.7, 0.9),
        queries=("benign", "attack"),
        tokens=(128, 256),
    ),
    ("keep_rates", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=TEN,
        queries=("keep",),
        tokens=(128, 256),
    ),
    ("whitelist", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal",),
        policies=ALL5,
        variants=("base", "whitelist"),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(128, 256),
    ),
    ("fair", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal",),
        policies=ALL5,
        variants=("base", "whitelist", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(128, 256),
    ),
    ("fair_flipped", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("flipped",),
        policies=ALL5,
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(128, 256),
    ),
    ("debias", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=("streamingllm",),
        variants=("fair",),
        lams=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        ratios=(0.0, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(128, 256),
    ),
    ("trec", "cpu"): dict(
        dataset="trec_1k",
        n=50,
        orders=("normal",),
        policies=("streamingllm", "snapkv"),
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(128, 64),
    ),
    ("trec_debias", "cpu"): dict(
        dataset="trec_1k",
        n=50,
        orders=("normal",),
        policies=("snapkv", "tova"),
        variants=("fair",),
        lams=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        ratios=(0.0, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(128, 64),
    ),
    ("spans", "cpu"): dict(
        dataset="spans_2",
        n=10,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.5, 0.7),
        queries=("benign",),
        tokens=(128, 128),
    ),
    ("attacks", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=2,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base", "whitelist", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.5),
        queries=("benign", "attack"),
        tokens=(128, 256),
    ),
    ("defenses", "cpu"): dict(
        dataset="sys_ifeval_shuffled",
        n=50,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("attack",),
        tokens=(128, 256),
    ),
    ("degradation", "paper"): dict(
        dataset="sys_ifeval",
        n=None,
        orders=("normal",),
        policies=("streamingllm",),
        variants=("base",),
        lams=(1.0,),
        ratios=TEN,
        queries=("benign",),
        tokens=(256, 1280),
    ),
    ("policies", "paper"): dict(
        dataset="sys_ifeval",
        n=None,
        orders=("normal",),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=TEN,
        queries=("benign",),
        tokens=(256, 1280),
    ),
    ("leakage", "paper"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=TEN,
        queries=("benign", "attack"),
        tokens=(256, 1280),
    ),
    ("keep_rates", "paper"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base",),
        lams=(1.0,),
        ratios=TEN,
        queries=("keep",),
        tokens=(256, 1280),
    ),
    ("whitelist", "paper"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base", "whitelist"),
        lams=(1.0,),
        ratios=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(256, 1280),
    ),
    ("fair", "paper"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base", "whitelist", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(256, 1280),
    ),
    ("fair_flipped", "paper"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("flipped",),
        policies=ALL5,
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=TEN,
        queries=("benign", "attack"),
        tokens=(256, 1280),
    ),
    ("debias", "paper"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("fair",),
        lams=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        ratios=TEN,
        queries=("benign", "attack"),
        tokens=(256, 1280),
    ),
    ("trec", "paper"): dict(
        dataset="trec_1k",
        n=None,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=TEN,
        queries=("benign", "attack"),
        tokens=(256, 64),
    ),
    ("trec_debias", "paper"): dict(
        dataset="trec_1k",
        n=None,
        orders=("normal", "flipped"),
        policies=("snapkv", "tova"),
        variants=("fair",),
        lams=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        ratios=TEN,
        queries=("benign", "attack"),
        tokens=(256, 64),
    ),
    ("spans", "paper"): dict(
        dataset="spans_2",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=TEN,
        queries=("benign",),
        tokens=(256, 1280),
    ),
    ("attacks", "paper"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base", "whitelist", "fair"),
        lams=(1.0,),
        ratios=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
        queries=("benign", "attack"),
        tokens=(256, 1280),
    ),
    ("defenses", "paper"): dict(
        dataset="sys_ifeval_shuffled",
        n=100,
        orders=("normal", "flipped"),
        policies=ALL5,
        variants=("base", "fair"),
        lams=(1.0,),
        ratios=TEN,
        queries=("attack",),
        tokens=(256, 1280),
    ),
}


@pytest.mark.parametrize("name, profile", list(GRIDS))
def test_every_study_grid_in_every_profile(name, profile):
    grid = studies.grid(name, profile)
    got = dict(
        dataset=grid.dataset,
        n=grid.n_prompts,
        orders=grid.orders,
        policies=grid.policies,
        variants=grid.variants,
        lams=grid.lams,
        ratios=grid.ratios,
        queries=grid.queries,
        tokens=(grid.max_new_tokens, grid.benign_tokens),
    )
    assert got == GRIDS[(name, profile)]
    assert (grid.model, grid.dtype) == MODELS[profile]
    if "whitelist" in grid.variants:  # Section 5.1: the whitelist stops fitting the budget beyond r = 0.7
        assert max(grid.ratios) <= 0.7


def test_the_grid_table_covers_every_study_and_profile():
    assert set(GRIDS) == {(name, profile) for name in studies.SWEEPS for profile in studies.PROFILES}


def test_the_benign_side_runs_on_its_own_part_of_the_grid():
    """At the cpu profile the IFEval (benign) query runs on the first 50 of the attack side's 100 prompts, normal order,
    or where a study says otherwise (leakage: all 100, StreamingLLM in both orders; the mitigations of notebooks 05-06:
    all 100 at Table 1's ratios; Figs 2-3: all 100 at 512 new tokens); the parts cover the same cells a single grid
    would; explicit overrides reach both parts; ci runs one grid."""
    attack, benign = studies.parts("leakage", "cpu")
    assert (attack.queries, attack.n_prompts, attack.orders, len(attack.policies)) == (("attack",), 100, BOTH, 5)
    assert (benign.queries, benign.n_prompts, benign.orders, benign.policies) == (
        ("benign",),
        100,
        BOTH,
        ("streamingllm",),
    )
    assert (benign.ratios, benign.max_new_tokens, benign.benign_tokens) == (attack.ratios, 128, 256)
    attack, benign = studies.parts("whitelist", "cpu")
    assert (benign.n_prompts, benign.orders, benign.ratios) == (100, ("normal",), (0.0, 0.4, 0.5, 0.6, 0.7))
    assert [(p.n_prompts, p.orders) for p in studies.parts("fair_flipped", "cpu")] == [(100, ("flipped",))] * 2
    assert studies.parts("debias", "cpu")[1].n_prompts == 50  # the profile's benign side where no study grows it
    assert [part.queries for part in studies.parts("degradation", "cpu")] == [("benign",)]
    for name in ("degradation", "policies"):  # Figs 2-3
        assert [(p.n_prompts, p.benign_tokens) for p in studies.parts(name, "cpu")] == [(100, 512)]
    small = studies.parts("leakage", "cpu", n_prompts=8, orders=["normal"])
    assert [(part.n_prompts, part.orders) for part in small] == [(8, ("normal",)), (8, ("normal",))]
    assert studies.parts("leakage", "cpu", n_prompts=20)[1].n_prompts == 20  # never more prompts than the study
    assert studies.parts("leakage", "ci") == [studies.grid("leakage", "ci")]
    assert studies.results_folder("cpu") == results_dir() / "cpu"


def test_added_cells_count_a_cell_two_studies_share_once():
    """The sizes behind ``MINUTES`` and scaleout's estimate: at the cpu profile Fig 3's grid holds Fig 2's StreamingLLM
    cells (r = 0, 0.3, 0.5, 0.7, 0.9), so it adds 1600 of its 2100; the same count as the ids the store keys rows by."""
    added = studies.added_cells("cpu")
    assert added["degradation"] == (1000, Counter({("benign", 512): 1000}))
    assert added["policies"] == (2100, Counter({("benign", 512): 1600}))
    assert added["keep_rates"] == (9200, Counter({("keep", 0): 9200}))
    ids = set()
    for name in ("degradation", "policies"):
        for part in studies.parts(name, "cpu"):
            records = tuple(data.load_records(part.dataset)[: part.n_prompts])
            ids |= set(experiment.Job(part, records, experiment._checksum(part.model), {}, {}, {}).cells().values())
    assert len(ids) == 2600
    assert studies.added_cells("paper")["trec"] is None  # all of LongBench: its size is not known without its data


def test_describe_says_what_the_rows_hold_and_the_papers_grid():
    """The printed description is read off the rows (prompts per query kind when they differ, rows and distinct
    cells, which the progress bar counts) and names the paper's grid for the study, never a profile note about
    another grid."""
    row = lambda key, query, policy, cell: dict(key=key, query=query, order="normal", policy=policy, cell_id=cell)
    rows = pd.DataFrame(
        [
            row(1, "attack", "streamingllm", "a"),
            row(1, "attack", "snapkv", "a"),
            row(2, "attack", "snapkv", "b"),
            row(1, "benign", "snapkv", "c"),
        ]
    )
    text = studies.describe("leakage", studies.grid("leakage", "cpu"), rows)
    assert "prompts per query attack: 2 (normal), benign: 1 (normal)" in text
    assert "4 rows, 3 distinct cells" in text and "(bfloat16)" in text
    assert text.endswith(
        "the paper's grid for this study: 100 prompts of sys_ifeval_shuffled, orders ['normal', "
        "'flipped'], ratios [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], lambdas [1.0], "
        "max_new_tokens 1280 (benign) / 256 (attack)"
    )


def test_study_overrides_and_errors():
    assert studies.grid("leakage", "ci", n_prompts=2, ratios=None).n_prompts == 2
    assert studies.grid("leakage", "ci", ratios=None).ratios == studies.PROFILES["ci"].ratios
    assert studies.grid("keep_rates", "ci").queries == ("keep",)
    with pytest.raises(studies.StudyError, match="unknown study 'fig99'"):
        studies.grid("fig99")
    with pytest.raises(experiment.GridError, match="unknown profile"):
        studies.grid("leakage", "laptop")


def test_benign_flags_mark_only_benign_refusals_and_capped_answers():
    rows = pd.DataFrame(
        [
            _row(query="benign", response="I can't assist with that request.", new_tokens=9, max_new_tokens=256),
            _row(query="benign", response="Here is your poem about the sea...", new_tokens=256, max_new_tokens=256),
            _row(query="attack", response="I can't assist with that request.", new_tokens=128, max_new_tokens=128),
        ]
    )
    marked = analysis.with_benign_flags(rows)
    assert marked["benign_refused"].tolist()[:2] == [1.0, 0.0] and math.isnan(marked["benign_refused"].iloc[2])
    assert marked["benign_capped"].tolist()[:2] == [0.0, 1.0] and math.isnan(marked["benign_capped"].iloc[2])


def test_figures_say_what_they_plot(tmp_path):
    """A published figure carries a line saying what it plots, which nbval compares: a change in the data is a
    change in the notebook's output, not only in a PNG nobody diffs. Two policies at two ratios, accuracy 0.2/0.4 and
    0.6/0.8 on one prompt: 2 lines, mean 0.5."""
    from fairkv.report import figures

    rows = pd.DataFrame(
        [
            _row(policy=p, ratio=r, prompt_strict=v)
            for p, values in (("streamingllm", (0.2, 0.4)), ("knorm", (0.6, 0.8)))
            for r, v in zip((0.0, 0.5), values)
        ]
    )
    fig = figures.policy_curves(rows, {"prompt_strict": "accuracy"}, "t")
    assert figures.plotted(fig) == "plotted: 2 lines, 0 points, 0 image cells; mean value 0.5000"
    shown = figures.publish(fig, "curves", tmp_path).data
    assert shown.endswith("plotted: 2 lines, 0 points, 0 image cells; mean value 0.5000")
    assert (tmp_path / "curves.png").is_file()
    moved = rows.assign(prompt_strict=rows["prompt_strict"] + 0.1)
    assert "mean value 0.6000" in figures.plotted(figures.policy_curves(moved, {"prompt_strict": "accuracy"}, "t"))


def test_each_panel_states_its_own_n_and_small_values_get_their_own_scale():
    """Accuracy on 2 prompts of StreamingLLM only, leakage (means up to 0.075) on 4 prompts of StreamingLLM and K-Norm:
    the accuracy panel says "n = 2 prompts, StreamingLLM only", the leakage panel "n = 4 prompts" on a 0-0.15 axis
    that its label states; the same in a variant figure's row labels, where K-Norm's accuracy panel says it was not
    run."""
    from fairkv.report import figures

    benign = [_row(policy="streamingllm", ratio=r, key=k, prompt_strict=0.5) for k in (1, 2) for r in (0.0, 0.5)]
    attack = [
        _row(policy=p, ratio=r, key=k, query="attack", leak_directive=0.02 + 0.06 * r * (p == "knorm") + 0.01 * k % 2)
        for p in ("streamingllm", "knorm")
        for k in (1, 2, 3, 4)
        for r in (0.0, 0.5)
    ]
    rows = pd.DataFrame(benign + attack)
    fig = figures.policy_curves(rows, {"prompt_strict": "accuracy", "leak_directive": "leakage"}, "t")
    accuracy, leakage = fig.axes[:2]
    assert accuracy.get_title() == "n = 2 prompts, StreamingLLM only" and accuracy.get_ylim() == (-0.05, 1.05)
    assert leakage.get_title() == "n = 4 prompts" and leakage.get_ylim()[1] == pytest.approx(0.15)
    assert leakage.get_ylabel() == "leakage (y axis 0-0.15)"
    fig = figures.variant_figure(rows, {"prompt_strict": "accuracy", "leak_directive": "leakage"}, "t")
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
    assert labels == ["accuracy (n = 2)", "leakage (y axis 0-0.15)\n(n = 4)"]
    blank = [ax for ax in fig.axes if not ax.lines]  # K-Norm's accuracy: not measured, and the panel says so
    assert len(blank) == 1 and blank[0].texts[0].get_text() == "not run at\nthis profile"


def test_every_study_names_the_claims_its_notebook_checks_and_every_notebook_is_timed():
    """A study's ``claims`` is the module of ``fairkv.studies`` that declares its claims, the one its notebook reads
    its rows with (``paper_vs_us``); the cli's time of every notebook comes from ``studies.MINUTES``; the plans that are
    not grids have a scale at each profile they list."""
    notebooks = sorted(cli.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    for name, chosen in studies.STUDIES.items():
        module = importlib.import_module(f"fairkv.studies.{chosen.claims}")
        assert module.CLAIMS and fairkv.studies.MODULES[chosen.notebook] == chosen.claims, name
        (notebook,) = [nb for nb in notebooks if nb.name.startswith(chosen.notebook)]
        assert re.search(rf"from fairkv.studies import [^\n]*\b{chosen.claims}\b", notebook.read_text()), name
    for kind, minutes in studies.MINUTES.values():
        assert set(minutes) == {nb.name[:2] for nb in notebooks}, kind
    for notebook in notebooks[1:]:  # 00, the quickstart, runs no study
        code = "".join(
            "".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"
        )
        written = set(re.findall(r'"(\d\d_[a-z0-9_]+)"', code))
        declared = [f for s in studies.STUDIES.values() if s.notebook == notebook.name[:2] for f in s.figures]
        assert sorted(declared) == sorted(written), notebook.name  # each written once, by one study
    assert studies.scale("atlas", "cpu")["n_prompts"] == 100
    with pytest.raises(studies.StudyError, match="study 'atlas_attacks' has no scale for profile 'paper'"):
        studies.grid("atlas_attacks", "paper")
    with pytest.raises(studies.StudyError, match="plan of its own"):
        studies.grid("runtime", "ci")
