"""Verdicts with intervals (issue: a point estimate from a few prompts is never a finding): hand-worked cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fairkv.report import analysis, paper, verdicts
from fairkv.report.verdicts import FAILS, HOLDS, INCONCLUSIVE, Estimate


def prompts(values) -> pd.Series:
    return pd.Series(values, index=range(len(values)), dtype=float)


def test_rate_has_a_wilson_interval_and_three_verdicts():
    """3 of 10: Wilson centre (3 + 1.92) / 13.84 = 0.356, half width 0.248: [0.108, 0.603]."""
    estimate = verdicts.rate([1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    assert (estimate.value, estimate.n) == (0.3, 10)
    assert estimate.low == pytest.approx(0.108, abs=0.001) and estimate.high == pytest.approx(0.603, abs=0.001)
    assert verdicts.decide(estimate, above=0.1) == HOLDS  # the whole interval above 0.1
    assert verdicts.decide(estimate, above=0.5) == INCONCLUSIVE  # straddles 0.5
    assert verdicts.decide(estimate, below=0.05) == FAILS  # none of it below 0.05
    assert verdicts.decide(estimate, above=0.05, below=0.7) == HOLDS
    with pytest.raises(verdicts.VerdictError, match="0/1 values"):
        verdicts.rate([0.5, 1.0])


def test_paired_binary_difference_is_newcombe():
    """Refused at r = 0 by all 10 prompts and by none at r = 0.5: p1 - p2 = 1, Wilson(10/10) = [0.722, 1], so the
    lower bound is 1 - sqrt(0.278^2 + 0.278^2) = 0.608 (phi = 0: a margin is empty): the drop holds. Refused at both
    ratios by all 10: [-0.278, +0.278], no evidence either way: inconclusive, not "fails"."""
    dropped = verdicts.difference(prompts([1] * 10), prompts([0] * 10))
    assert dropped.value == 1.0 and dropped.low == pytest.approx(0.608, abs=0.001) and dropped.high == 1.0
    assert verdicts.decide(dropped, above=0) == HOLDS
    kept = verdicts.difference(prompts([1] * 10), prompts([1] * 10))
    assert (
        kept.value == 0.0
        and kept.low == pytest.approx(-0.278, abs=0.001)
        and kept.high == pytest.approx(0.278, abs=0.001)
    )
    assert verdicts.decide(kept, above=0) == INCONCLUSIVE
    # 5 refuse under both, 4 only under a, 1 under neither: phi = (5 x 1 - 0) / sqrt(9 x 1 x 5 x 5) = 1/3,
    # lower bound 0.4 - sqrt(0.304^2 - 2/3 x 0.304 x 0.263 + 0.263^2) = 0.071
    mixed = verdicts.difference(prompts([1] * 9 + [0]), prompts([1] * 5 + [0] * 5))
    assert mixed.value == pytest.approx(0.4) and mixed.low == pytest.approx(0.071, abs=0.002)


def test_paired_continuous_difference_is_a_paired_bootstrap():
    """The same 0.3 gap on every prompt: the interval is [0.3, 0.3] however noisy each side is; unpaired, the noise
    would widen it. A claimed decrease then fails; a tie [0, 0] fails a claimed increase."""
    noise = np.linspace(0.0, 0.6, 10)
    gap = verdicts.difference(prompts(noise + 0.3), prompts(noise))
    assert (gap.low, gap.value, gap.high) == pytest.approx((0.3, 0.3, 0.3))
    assert verdicts.decide(gap, above=0) == HOLDS and verdicts.decide(gap, below=0) == FAILS
    tie = verdicts.difference(prompts(noise), prompts(noise))
    assert verdicts.decide(tie, above=0) == FAILS
    few = verdicts.difference(prompts(noise[:4]), prompts(noise[:4]))  # [0, 0] from 4 prompts decides nothing
    assert (few.low, few.high) == (0.0, 0.0) and verdicts.decide(few, above=0) == INCONCLUSIVE
    assert verdicts.decide(verdicts.rate([0, 0, 0, 0]), above=0.7) == FAILS  # Wilson [0, 0.49] holds at n = 4
    with pytest.raises(verdicts.VerdictError, match="same prompts"):
        verdicts.difference(prompts(noise), prompts(noise[:5]))


def test_compound_claims_and_undefined_intervals():
    assert verdicts.all_of([HOLDS, HOLDS]) == HOLDS
    assert verdicts.all_of([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE
    assert verdicts.all_of([INCONCLUSIVE, FAILS, HOLDS]) == FAILS
    assert verdicts.decide(Estimate(0.4, np.nan, np.nan, 1), above=0) == INCONCLUSIVE  # one prompt: no interval
    assert str(Estimate(0.4, np.nan, np.nan, 1)) == "0.40 [too few prompts for an interval (n = 1)]"
    assert str(Estimate(0.4, np.nan, np.nan, 12)) == "0.40 [no interval]"  # most resamples undefined
    assert Estimate(np.nan, np.nan, np.nan, 4).signed() == "undefined"  # e.g. no class to normalise
    # a bootstrap under MIN_BOOTSTRAP prompts prints no interval and decides nothing, even one excluding zero
    few = Estimate(0.22, 0.02, 0.22, 2)
    assert few.signed() == "+0.22 [too few prompts for an interval (n = 2)]"
    assert verdicts.decide(few, above=0) == INCONCLUSIVE
    assert Estimate(-0.1, -0.3, 0.05, 10).signed() == "-0.10 [-0.30, +0.05]"
    # a bound at zero stays visible: +0.003 is not +0.00, -0.0004 not -0.00
    assert Estimate(-0.04, -0.08, 0.003, 10).signed() == "-0.04 [-0.08, +0.003]"
    assert Estimate(-0.04, -0.08, -0.0004, 10, "wilson").signed() == "-0.04 [-0.08, -0.0004]"
    assert Estimate(0.0, 0.0, 0.04, 10).signed() == "+0.00 [+0.00, +0.04]"
    with pytest.raises(verdicts.VerdictError, match="region"):
        verdicts.decide(Estimate(0.4, 0.1, 0.5, 10))


@pytest.mark.parametrize(
    "estimate, paper, kind, expected",
    [
        (Estimate(0.13, 0.08, 0.17, 100), (0.50, 0.55), "leakage", verdicts.DIFFERS),  # directive leakage: 3-4x below
        (Estimate(0.13, 0.08, 0.17, 100), 0.27, "leakage", verdicts.MATCHES),  # 0.27 <= 0.17 + 0.10
        (Estimate(0.13, 0.08, 0.17, 100), 0.28, "leakage", verdicts.DIFFERS),
        (Estimate(1.00, 0.98, 1.01, 10), 1.33, "cost", verdicts.DIFFERS),  # the whitelist's compression cost
        (Estimate(1.02, 0.97, 1.03, 10), 1.08, "cost", verdicts.MATCHES),
        (Estimate(0.02, -0.01, 0.05, 50), 0.0, "difference", verdicts.MATCHES),
        (Estimate(0.5, 0.1, 0.9, 4), 0.5, "share", verdicts.NOT_APPLICABLE),  # too few prompts for an interval
        (Estimate(0.5, 0.1, 0.9, 40), None, "share", verdicts.NOT_APPLICABLE),  # the paper gives no number
    ],
)
def test_magnitude_compares_the_papers_number_with_our_interval(estimate, paper, kind, expected):
    assert verdicts.magnitude(estimate, paper, kind) == expected


def test_magnitude_of_several_parts_and_bad_kind():
    assert verdicts.all_magnitudes([verdicts.MATCHES, verdicts.MATCHES]) == verdicts.MATCHES
    assert verdicts.all_magnitudes([verdicts.MATCHES, verdicts.DIFFERS, verdicts.NOT_APPLICABLE]) == verdicts.DIFFERS
    assert verdicts.all_magnitudes([verdicts.MATCHES, verdicts.NOT_APPLICABLE]) == verdicts.NOT_APPLICABLE
    with pytest.raises(verdicts.VerdictError, match="unknown kind of quantity 'speed'"):
        verdicts.magnitude(Estimate(0.1, 0.0, 0.2, 10), 0.1, "speed")


def test_resampled_statistic_keeps_prompts_paired():
    """A statistic of two settings' means over the same prompts: resampling prompts keeps each prompt's pair, so a
    constant per-prompt gap gives a zero-width interval."""
    rows = pd.DataFrame(
        [{"key": k, "setting": s, "v": k / 10 + (0.2 if s == "b" else 0.0)} for k in range(10) for s in ("a", "b")]
    )
    statistic = lambda f: f[f["setting"] == "b"]["v"].mean() - f[f["setting"] == "a"]["v"].mean()
    estimate = verdicts.resampled(rows, statistic)
    assert (estimate.low, estimate.value, estimate.high, estimate.n) == pytest.approx((0.2, 0.2, 0.2, 10))
    assert np.isnan(verdicts.resampled(rows[rows["key"] == 0], statistic).low)  # one prompt: no interval


def keep_rows(directive: float, defense: float, n: int = 10, ratios=(0.0, 0.5)) -> pd.DataFrame:
    """Keep-rate rows of all five policies in both orders: the later span keeps ``directive`` (normal order), the
    earlier ``defense``; flipped, the roles swap; with a small per-prompt wobble."""
    rows = []
    for key in range(n):
        wobble = 0.01 * (key % 3)
        for policy in ("streamingllm", "h2o", "snapkv", "tova", "knorm"):
            for order, (d, f) in (("normal", (directive, defense)), ("flipped", (defense, directive))):
                for ratio in ratios:
                    rows.append(
                        {
                            "key": key,
                            "policy": policy,
                            "variant": "base",
                            "order": order,
                            "ratio": ratio,
                            "keep_directive": d + wobble,
                            "keep_defense": f + wobble,
                        }
                    )
    return pd.DataFrame(rows)


def test_claims_read_at_the_papers_ratio_or_refuse():
    """Fig 7: directive 0.9, defense 0.4 on 10 prompts: StreamingLLM keeps the later span (holds), the bias reverses
    (holds), K-Norm favours the earlier span in both orders (fails: it favours the later one here), TOVA keeps the
    defense as well as the directive (fails). Without r = 0.5 in the rows the claims are an error, not r = 0.7's."""
    claims = paper.pitfall5(keep_rows(0.9, 0.4)).set_index("claim")
    assert claims["verdict"].tolist() == [HOLDS, HOLDS, FAILS, FAILS]
    assert (claims["n"] == 10).all() and "difference +0.50 [+0.50, +0.50]" in claims["ours"].iloc[0]
    with pytest.raises(analysis.AnalysisError, match=r"needs r = 0.5; the rows hold r in \[0.0, 0.7\]"):
        paper.pitfall5(keep_rows(0.9, 0.4, ratios=(0.0, 0.7)))
    few = paper.pitfall5(keep_rows(0.9, 0.4, n=1))  # one prompt: a point estimate is never a finding
    assert set(few["verdict"]) == {INCONCLUSIVE}


def test_magnitude_compares_the_papers_keep_rates_and_says_why_it_differs():
    """Fig 7's StreamingLLM keep rates (paper: directive 0.90-0.95, defense 0.40-0.50): 0.9 / 0.4 match; 0.6 / 0.4
    differ, with the reason; a claim without a number of the paper is n.a."""
    matching = paper.pitfall5(keep_rows(0.9, 0.4))
    assert matching["magnitude"].tolist()[0] == verdicts.MATCHES and matching["why"].iloc[0] == ""
    differing = paper.pitfall5(keep_rows(0.6, 0.4))
    assert differing["magnitude"].iloc[0] == verdicts.DIFFERS and differing["why"].iloc[0].startswith("model: ")
    assert (matching["magnitude"].iloc[1:] == verdicts.NOT_APPLICABLE).all()
    assert matching["why"].iloc[2].startswith("model: ")  # K-Norm's claim fails here: why is said


def judged_rows(n: int = 20) -> pd.DataFrame:
    """StreamingLLM's judged attack rows: no leak at r = 0, every response a leak at r = 0.5, none with the
    whitelist."""
    rows = []
    for key in range(n):
        for variant, ratio, leak in (("base", 0.0, 0), ("base", 0.5, 1), ("whitelist", 0.5, 0)):
            rows.append(
                {
                    "key": key,
                    "policy": "streamingllm",
                    "variant": variant,
                    "ratio": ratio,
                    "judge_leak": leak,
                    "judge_expected": 3.0 * leak + 0.01 * key,
                    analysis.LEAKAGE: 0.5 * leak + 0.001 * key,
                    "cell_id": f"{key}-{variant}-{ratio}",
                }
            )
    return pd.DataFrame(rows)


def test_judge_claims_decide_nothing_while_the_judge_is_poorly_calibrated():
    """The judge's calibration is quoted beside each claim; with its interval below 0.8 every claim resting on it is
    inconclusive, however clear the rows (broken on purpose: the caveat ignored -> 'holds')."""
    calibration = lambda low: pd.DataFrame(
        [{"kind": "all", "n": 36, "accuracy": low + 0.1, "low": low, "high": min(low + 0.2, 1.0)}]
    )
    trusted = paper.judge(judged_rows(), calibration=calibration(0.85)).set_index("claim")
    assert trusted["verdict"].iloc[:2].tolist() == [HOLDS, HOLDS]
    assert "judge right on 0.95 [0.85, 1.00] of 36 labelled responses" in trusted["ours"].iloc[0]
    poor = paper.judge(judged_rows(), calibration=calibration(0.53))
    assert set(poor["verdict"]) == {INCONCLUSIVE} and "(below 0.8: decides nothing)" in poor["ours"].iloc[0]
    assert poor["paper"].iloc[-1] == paper.OURS  # the rank agreement with ROUGE-L is our claim, not the paper's


def test_summary_counts_the_three_verdicts(tmp_path):
    table = pd.DataFrame(
        [
            paper._claim("Fig 4", "a", "x", "0.5 [0.2, 0.8]", HOLDS, 10),
            paper._claim("Fig 4", "b", "x", "y", FAILS, 10),
            paper._claim("Fig 4", "c", "x", "y", INCONCLUSIVE, 10),
        ]
    )
    tables = tmp_path / "tables"
    tables.mkdir()
    table = pd.concat(
        [
            table.assign(magnitude=[verdicts.MATCHES, verdicts.DIFFERS, verdicts.NOT_APPLICABLE]),
            pd.DataFrame([paper._claim("Fig 4", "d", paper.OURS, "y", FAILS, 10, why="code")]),
        ]
    )
    table.to_csv(tables / "03_paper_vs_us.csv", index=False)
    table.iloc[:1].to_csv(tables / "12_paper_vs_us.csv", index=False)  # a notebook beyond the paper: ours
    summary = paper.write_summary(tmp_path, "t").read_text()
    paper_part, ours = summary.split(
        "## Beyond the paper: our own claims (notebooks 03, 12): 2 claims; direction: 1 holds, 1 fails, 0 inconclusive"
    )
    assert (
        "## The paper's claims (notebooks 03): 3 claims; direction: 1 holds, 1 fails, 1 inconclusive; magnitude: "
        "1 matches, 1 differs, 1 n.a."
    ) in paper_part
    assert "### Notebook 03: 1 holds, 1 fails, 1 inconclusive (of 3)" in paper_part and "0.5 [0.2, 0.8]" in paper_part
    assert "### Notebook 03: 0 holds, 1 fails, 0 inconclusive (of 1)" in ours  # the claim the paper does not make
    assert "### Notebook 12, the press atlas: 1 holds, 0 fails, 0 inconclusive (of 1)" in ours
    assert "leakage 0.1" in summary  # the tolerances, stated once
    # a table from before verdicts (a "holds" column of True / False) names itself and the notebook to re-run
    table.drop(columns="verdict").assign(holds=True).to_csv(tables / "11_paper_vs_us.csv", index=False)
    (tables / "11_paper_vs_us.md").write_text("old")
    with pytest.raises(paper.SummaryError, match=r"11_paper_vs_us.csv has no verdict column.*re-run notebook 11"):
        paper.write_summary(tmp_path, "t")


def fair_rows(order: str, variants, n_attack: int = 20, n_benign: int = 10) -> pd.DataFrame:
    """Rows of the fair-eviction study in one order: attack rows (directive leakage) on ``n_attack`` prompts, benign
    rows (accuracy) on the first ``n_benign``, as the cpu profile runs its two sides. StreamingLLM's accuracy at every
    r > 0: 1 base / 0.5 fair in the normal order, 0 base / 0.5 fair flipped; fair halves leakage everywhere."""
    accuracy = {("normal", "base"): 1.0, ("flipped", "base"): 0.0}
    rows = []
    for policy in ("streamingllm", "snapkv"):
        for variant in variants:
            for ratio in (0.0, 0.4, 0.5, 0.6, 0.7):
                for key in range(n_attack):
                    leak = 0.0 if ratio == 0 else (0.4 if variant == "base" else 0.2)
                    rows.append(
                        {
                            "key": key,
                            "policy": policy,
                            "variant": variant,
                            "order": order,
                            "ratio": ratio,
                            "query": "attack",
                            analysis.LEAKAGE: leak + 0.01 * (key % 3),
                        }
                    )
                for key in range(n_benign):
                    rows.append(
                        {
                            "key": key,
                            "policy": policy,
                            "variant": variant,
                            "order": order,
                            "ratio": ratio,
                            "query": "benign",
                            analysis.ACCURACY: accuracy.get((order, variant), 0.5),
                        }
                    )
    return pd.DataFrame(rows)


def test_fair_eviction_claims_count_the_prompts_of_their_own_side():
    """Leakage claims read the 20 attack prompts; the order-gap claim reads accuracy, which only 10 prompts have: its
    n is 10 (a bootstrap over all 20 would draw prompts without accuracy and report n = 20). The gap shrinks from 1 to
    0 on every prompt: holds."""
    claims = paper.fair_eviction(
        fair_rows("normal", ("base", "whitelist", "fair")), fair_rows("flipped", ("base", "fair"))
    ).set_index("claim")
    leakage = claims.filter(like="lowers StreamingLLM directive leakage", axis=0)
    assert leakage["n"].tolist() == [20] and leakage["verdict"].tolist() == [HOLDS]
    gap = claims.filter(like="order effect", axis=0)
    assert gap["n"].tolist() == [10] and gap["verdict"].tolist() == [HOLDS]
    assert "+1.00 [+1.00, +1.00]" in gap["ours"].iloc[0]
