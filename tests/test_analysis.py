"""The paper's derived quantities on hand-worked examples (expected numbers written out) and the figures that plot them
(the studies' grids: ``test_study_grids.py``)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fairkv.report import analysis, verdicts
from fairkv.studies import reading


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


def test_rho_is_scipys_statistic_to_the_bit():
    """``analysis.spearman``'s rank correlation is ``scipy.stats.spearmanr``'s statistic exactly (the bootstraps call
    it thousands of times, so it skips scipy's per-call checks): on tied class accuracies as bootstraps draw them, and
    NaN where fewer than 3 classes or a side is constant (broken on purpose: Pearson's r of the raw values ->
    differs)."""
    rng = np.random.default_rng(0)
    for size in range(3, 30):
        x, y = rng.integers(0, 5, size) / 4, rng.integers(0, 7, size) / 6
        if np.unique(x).size > 1 and np.unique(y).size > 1:
            assert analysis._rank_correlation(x, y) == stats.spearmanr(x, y).statistic
    assert math.isnan(analysis._rank_correlation(np.array([0.1, 0.2]), np.array([0.3, 0.1])))
    assert math.isnan(analysis._rank_correlation(np.array([0.5] * 4), np.array([0.1, 0.2, 0.3, 0.4])))


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


def test_a_tables_cell_is_the_claims_estimate_of_the_same_setting():
    """A table's cell (``means``) and a claim's estimate (``reading.values`` then ``verdicts.mean``) of one setting
    read the prompts in the same order, so they are one interval: rows stored in another order than their keys (as a
    store holds them) once gave 0.13 [0.09, 0.17] in a table and 0.13 [0.08, 0.17] in its claim (broken on purpose:
    the rows left in stored order -> the intervals differ)."""
    keys = [7, 2, 9, 0, 5, 3, 8, 1, 6, 4, 11, 10]
    rows = pd.DataFrame([_row(query="attack", key=k, leak_directive=(k * 0.37) % 0.5) for k in keys])
    cell = analysis.means(rows, "leak_directive").iloc[0]
    claimed = verdicts.mean(reading.values(rows, "leak_directive", 0.0, query="attack"))
    assert (cell["mean"], cell["low"], cell["high"]) == (claimed.value, claimed.low, claimed.high)


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
