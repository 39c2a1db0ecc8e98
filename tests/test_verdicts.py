"""Verdicts with intervals (issue: a point estimate from a few prompts is never a finding): hand-worked cases."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from fairkv.report import claims, readme, situations, summary, verdicts
from fairkv.report.claims import Claim, Measured, Number, Part
from fairkv.report.noise import Noise
from fairkv.report.verdicts import FAILS, HOLDS, INCONCLUSIVE, UNTESTABLE, Estimate


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
        (Estimate(0.13, 0.08, 0.17, 100), 0.27, "leakage", verdicts.TOO_UNCERTAIN),  # [0.17, 0.37] holds 0.17, not 0.08
        (Estimate(0.13, 0.08, 0.17, 100), 0.28, "leakage", verdicts.DIFFERS),  # [0.18, 0.38] lies above 0.17
        (Estimate(0.13, 0.08, 0.17, 100), 0.15, "leakage", verdicts.MATCHES),  # [0.05, 0.25] holds [0.08, 0.17]
        (Estimate(1.00, 0.98, 1.01, 10), 1.33, "cost", verdicts.DIFFERS),  # the whitelist's compression cost
        (Estimate(1.02, 0.97, 1.03, 10), 1.08, "cost", verdicts.TOO_UNCERTAIN),  # 0.97 below 1.08 - 0.10
        (Estimate(1.05, 1.01, 1.09, 10), 1.08, "cost", verdicts.MATCHES),
        (Estimate(1.05, 1.00, 1.10, 10), 1.08, "cost", verdicts.TOO_UNCERTAIN),  # as wide as the tolerance
        (Estimate(0.02, -0.01, 0.05, 50), 0.0, "difference", verdicts.MATCHES),
        # an effect matches only within half the paper's size (issue 82: Table 1's H2O fair, -0.01 [-0.03, -0.001]
        # against the paper's +0.0064, matched with the score's 0.05 though its direction fails)
        (Estimate(-0.01, -0.03, -0.001, 100), 0.0064, "score", verdicts.DIFFERS),
        (Estimate(0.006, 0.005, 0.007, 100), 0.0064, "score", verdicts.MATCHES),  # within 0.0032 of it
        (Estimate(-0.35, -0.40, -0.31, 100), -0.40, "difference", verdicts.MATCHES),  # a large change: 0.10 stays
        (
            Estimate(-0.2, -0.60, 0.20, 100),
            0.30,
            "share",
            verdicts.TOO_UNCERTAIN,
        ),  # Table 3: a share that cannot differ
        (Estimate(0.5, 0.1, 0.9, 4), 0.5, "share", verdicts.NOT_APPLICABLE),  # too few prompts for an interval
        (Estimate(0.5, 0.1, 0.9, 40), None, "share", verdicts.NOT_APPLICABLE),  # the paper gives no number
    ],
)
def test_magnitude_compares_the_papers_number_with_our_interval(estimate, paper, kind, expected):
    assert verdicts.magnitude(estimate, paper, kind) == expected


def test_magnitude_of_several_parts_and_bad_kind():
    assert verdicts.all_magnitudes([verdicts.MATCHES, verdicts.MATCHES]) == verdicts.MATCHES
    assert verdicts.all_magnitudes([verdicts.MATCHES, verdicts.DIFFERS, verdicts.NOT_APPLICABLE]) == verdicts.DIFFERS
    assert verdicts.all_magnitudes([verdicts.MATCHES, verdicts.NOT_APPLICABLE]) == verdicts.TOO_UNCERTAIN
    assert verdicts.all_magnitudes([verdicts.NOT_APPLICABLE]) == verdicts.NOT_APPLICABLE
    assert verdicts.all_magnitudes([verdicts.MATCHES, verdicts.TOO_UNCERTAIN]) == verdicts.TOO_UNCERTAIN
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


def test_resampled_counts_a_prompt_drawn_twice_twice():
    """Resampling prompts with replacement: a prompt drawn twice is two units, also for a statistic that deduplicates
    by prompt or cell (notebook 10's rank agreement dropped the repeats: its interval was too narrow). Drawing units
    [0, 0, 1] names them 0, 0#1, 1; the count of distinct prompts is then always 10, never fewer (broken on purpose:
    without the renaming the interval is [5, 8])."""
    rows = pd.DataFrame([{"key": k, "cell_id": f"c{k}", "v": float(k)} for k in range(10)])
    drawn = verdicts._Units(rows, "key").draw(np.array([0, 0, 1]))
    assert drawn["key"].tolist() == ["0", "0#1", "1"] and drawn["cell_id"].tolist() == ["c0", "c0#1", "c1"]
    distinct = verdicts.resampled(rows, lambda f: f.drop_duplicates("cell_id")["key"].nunique())
    assert (distinct.low, distinct.high) == (10, 10)


def test_an_interval_at_another_level_and_bonferroni():
    """Every estimator gives its interval at another level: Wilson and Newcombe recomputed, a bootstrap from its own
    draws (the normal interval once the tail holds fewer than MIN_TAIL_DRAWS draws). 3 of 10 at 99.9% (z = 3.29):
    Wilson centre (0.3 + 0.541) / 2.083 = 0.404, half width 3.29 x sqrt(0.021 + 0.0271) / 2.083 = 0.346: [0.058,
    0.750]; a claim above 0.1 that holds at 95% is inconclusive there."""
    estimate = verdicts.rate([1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    low, high = estimate.interval(0.999)
    assert low == pytest.approx(0.058, abs=0.001) and high == pytest.approx(0.750, abs=0.001)
    assert verdicts.decide(estimate, above=0.1) == HOLDS
    assert verdicts.decide(estimate, above=0.1, level=0.999) == INCONCLUSIVE
    boot = verdicts.mean(np.linspace(0.0, 1.0, 40))
    assert boot.interval(0.999)[0] < boot.low and boot.interval(0.999)[1] > boot.high
    assert Estimate(0.4, 0.1, 0.5, 10).interval(0.999) == (0.1, 0.5)  # written by hand: its one interval
    assert claims.bonferroni_level(40) == pytest.approx(0.99875)


def test_a_null_within_its_margin_fails_and_one_straddling_it_is_inconclusive():
    """Fig 6's defense-leakage rise, -0.004 [-0.01, +0.003]: a precise null. With the claim's margin 0.02 it fails
    ("no effect"); without a margin it would be inconclusive for ever; [-0.01, +0.03] reaches past the margin:
    inconclusive (broken on purpose: the null test removed -> this read inconclusive)."""
    rise = Estimate(-0.004, -0.01, 0.003, 100)
    assert verdicts.decide(rise, above=0.0) == INCONCLUSIVE
    assert verdicts.decide(rise, above=0.0, margin=0.02) == FAILS
    assert verdicts.decide(Estimate(0.01, -0.01, 0.03, 100), above=0.0, margin=0.02) == INCONCLUSIVE
    assert verdicts.decide(Estimate(0.05, 0.03, 0.08, 100), above=0.0, margin=0.02) == HOLDS
    # an effect that excludes 0 yet lies wholly within the margin is negligible: fails, not holds
    assert verdicts.decide(Estimate(0.005, 0.001, 0.009, 100), above=0.0, margin=0.02) == FAILS
    with pytest.raises(verdicts.VerdictError, match="one bound"):
        verdicts.decide(rise, above=-0.05, below=0.05, margin=0.02)
    assert verdicts.all_of([HOLDS, UNTESTABLE]) == UNTESTABLE and verdicts.all_of([FAILS, UNTESTABLE]) == FAILS


def claim(**changes) -> Claim:
    declared = dict(
        id="t.drop",
        figure="Fig 4",
        claim="the mitigation lowers leakage",
        paper="{before} -> {after}",
        numbers={
            "before": Number(0.5, "leakage"),
            "after": Number(0.1, "leakage"),
            "change": Number(-0.4, "difference"),
        },
        below=0.0,
        region="a decrease",
        margin=0.02,
        null="a fifth of the smallest effect",
    )
    return Claim(**{**declared, **changes})


WORDS = dict(numbers={}, paper="lower")  # a claim the paper states in words only: nothing to size


def one(declared: Claim, measured: Measured) -> dict:
    return claims.heads(claims.table([claims.line(declared, measured, 10)])).iloc[0].to_dict()


def test_a_claims_line_hand_worked_cases():
    """One line per claim, from its declaration and measurement: an informative match, too uncertain, a change that
    matches while the levels differ, an equivalence fail, untestable, a multi-part claim, the judge's gate."""
    change = Estimate(-0.35, -0.39, -0.31, 100)
    exact = Measured(
        [Part("change", change)],
        "x",
        100,
        {"before": Estimate(0.5, 0.46, 0.54, 100), "after": Estimate(0.15, 0.11, 0.19, 100), "change": change},
    )
    line = one(claim(), exact)
    assert (line["verdict"], line["magnitude"], line["paper"]) == (HOLDS, verdicts.MATCHES, "0.50 -> 0.10")
    wide = Measured([Part("change", change)], "x", 100, {"after": Estimate(0.3, 0.05, 0.55, 100)})
    assert one(claim(), wide)["magnitude"] == verdicts.TOO_UNCERTAIN
    lower = Measured(
        [Part("change", change)], "x", 100, {"before": Estimate(0.12, 0.08, 0.16, 100), "change": change}, "why: x"
    )
    line = one(claim(), lower)
    assert (
        line["magnitude"] == verdicts.DIFFERS and "change matches" in line["ours"] and "before differs" in line["ours"]
    )
    assert line["why"] == "why: x"  # shown because the magnitude differs
    null = Measured([Part("change", Estimate(-0.004, -0.01, 0.003, 100))], "x", 100, why="why: y")
    line = one(claim(**WORDS), null)
    assert line["verdict"] == FAILS and "no effect, within +-0.02" in line["ours"] and line["why"] == "why: y"
    floor = Measured([Part("change", change)], "x", 100, {"after": Estimate(0.1, 0.05, 0.15, 100)}, untestable="at 0")
    line = one(claim(), floor)
    assert (line["verdict"], line["magnitude"]) == (UNTESTABLE, UNTESTABLE)  # its numbers are not sized either
    assert "untestable here: at 0" in line["ours"]
    parts = [Part("a", change), Part("b", change), Part("c", Estimate(0.2, 0.1, 0.3, 50), decides=False)]
    table = claims.table([claims.line(claim(**WORDS), Measured(parts, "x", 100), 10)])
    assert len(table) == 4 and len(claims.heads(table)) == 1 and table["verdict"].iloc[0] == HOLDS
    assert table["part"].iloc[3] == "c (shown, does not decide)" and table["verdict"].iloc[3] == "(fails)"
    failing = [Part("a", change), Part("b", Estimate(0.2, 0.1, 0.3, 50))]
    assert one(claim(**WORDS), Measured(failing, "x", 100))["verdict"] == FAILS
    with pytest.raises(claims.ClaimError, match="the paper gives numbers .* measure them"):
        one(claim(), Measured(failing, "x", 100))  # a paper number left unsized is an error, never a silent n.a.
    gated = Measured([Part("change", change)], "x", 100, {"change": change}, gate="the judge is poor")
    line = one(claim(judged=True), gated)
    assert (line["verdict"], line["magnitude"]) == (INCONCLUSIVE, verdicts.TOO_UNCERTAIN)
    assert one(claim(), gated)["verdict"] == HOLDS  # a claim not resting on the judge ignores its gate


def test_declarations_refuse_what_the_rules_cannot_read():
    with pytest.raises(claims.ClaimError, match="equivalence margin"):
        claim(margin=None, null="")
    with pytest.raises(claims.ClaimError, match="name 'peak'"):
        claim(paper="{peak}")
    with pytest.raises(claims.ClaimError, match="why the bound"):
        claim(region="")
    assert claim(margin=None, null="", effect=False).effect is False  # a level against a bound: no null to decide
    assert claim(margin=None, null="", status=claims.SANITY).status == claims.SANITY
    with pytest.raises(claims.ClaimError, match="not among the paper's numbers"):
        one(claim(), Measured([Part("x", Estimate(0.1, 0.0, 0.2, 10))], "x", 10, {"peak": Estimate(0.1, 0.0, 0.2, 10)}))


def test_summary_counts_claims_not_rows_and_keeps_sanity_checks_apart(tmp_path):
    """Two findings (one of two parts), one of ours and a sanity check: the paper's section counts 2 claims, not 4
    rows; the sanity check is listed apart and counted nowhere; a claim whose verdict changes at the Bonferroni level
    is named in the preamble (broken on purpose: counting rows -> '4 claims')."""
    change = Estimate(-0.35, -0.39, -0.31, 100)
    borderline = Estimate(-0.05, -0.09, -0.008, 100)
    lines = [
        claims.line(claim(**WORDS), Measured([Part("a", change), Part("b", change)], "x", 100), 4),
        claims.line(claim(id="t.two", **WORDS), Measured([Part("c", borderline)], "y", 100), 4),
        claims.line(claim(id="t.ours", status=claims.OURS, **WORDS), Measured([Part("c", change)], "z", 100), 4),
        claims.line(claim(id="t.window", status=claims.SANITY, **WORDS), Measured([Part("c", change)], "w", 100), 4),
    ]
    (tmp_path / "tables").mkdir()
    claims.table(lines).to_csv(tmp_path / "tables" / "03_paper_vs_us.csv", index=False)
    text = summary.write_summary(tmp_path, "t", 4, "thresholds here").read_text()
    assert "## The paper's claims: 2 claims, in direction 2 holds, 0 fails, 0 inconclusive, 0 untestable here" in text
    assert "## Beyond the paper: our own claims: 1 claim," in text
    assert "## Sanity checks (not counted): 1 sanity checks; 1 holds" in text
    assert "thresholds here" in text and "↳ a" in text
    assert (
        "Family-wise (Bonferroni, 1 - 5% / 4: the 4 claims tested on data here, sanity checks apart), the paper's "
        "claims on this model read 2 holds, 0 fails, 0 inconclusive, 0 untestable here. Of all the claims tested, "
        "none changes" in text
    )  # hand-written estimates have one interval
    pd.DataFrame([{"claim": "old", "verdict": HOLDS}]).to_csv(tmp_path / "tables" / "11_paper_vs_us.csv", index=False)
    with pytest.raises(summary.SummaryError, match="11_paper_vs_us.csv lacks the columns.*re-run notebook 11"):
        summary.write_summary(tmp_path, "t", 4, "")


def test_a_sanity_check_has_no_family_wise_reading():
    """The Bonferroni family counts the claims tested, sanity checks apart (``fairkv.studies.family``), so a sanity
    check has no verdict at the family's level: a drop whose 95% interval lies below 0 and whose 99.9% interval
    reaches past it changes there for a finding, never for a sanity check (broken on purpose: read for both -> the
    sanity check's column said inconclusive)."""
    drop = verdicts.mean(np.linspace(-0.16, 0.08, 20))  # [-0.07, -0.01] at 95%, [-0.08, +0.004] at 1 - 5% / 10
    assert drop.high < 0.0 < drop.interval(claims.bonferroni_level(10))[1]
    finding = one(claim(**WORDS), Measured([Part("drop", drop)], "x", 20))
    sanity = one(claim(status=claims.SANITY, **WORDS), Measured([Part("drop", drop)], "x", 20))
    assert (finding["verdict"], finding["bonferroni"]) == (HOLDS, INCONCLUSIVE)
    assert (sanity["verdict"], sanity["bonferroni"]) == (HOLDS, "")


def test_a_verdict_within_decoding_noise_is_marked():
    """Decoding noise with per-cell changes of +-0.1 (sd 0.141): over 100 prompts of two settings a mean may move by
    2 x 0.141 x sqrt(2 / 100) = 0.04. A change whose lower end is 0.01 above its bound is marked; one 0.06 above is
    not; a claim reading no decoded score is never (broken on purpose: the reach halved -> the first is unmarked)."""
    noise = Noise(
        pd.DataFrame(
            {
                "query": ["attack"] * 2,
                "same_response": [False, False],
                "parted_at": [3, 5],
                "leak_directive_delta": [0.1, -0.1],
            }
        )
    )
    assert noise.reach("leak_directive", 100) == pytest.approx(0.04)
    near = Measured([Part("change", Estimate(-0.05, -0.09, -0.01, 100))], "x", 100)
    far = Measured([Part("change", Estimate(-0.1, -0.14, -0.06, 100))], "x", 100)
    reading = claim(score="leak_directive")
    assert (
        claims.near_noise(reading, near, noise)
        == "within decoding noise (leak_directive): change 0.01 from its threshold (reach 0.04)"
    )
    assert claims.near_noise(reading, far, noise) == ""
    assert claims.near_noise(claim(), near, noise) == ""
    # a bootstrap over too few prompts has no interval, so nothing for the noise to move across
    few = Measured([Part("change", Estimate(-0.05, -0.09, -0.01, 2, method="bootstrap"))], "x", 2)
    assert claims.near_noise(reading, few, noise) == ""
    assert "leak_directive 100.0% (sd 0.141)" in noise.said()


def test_a_mechanism_within_decoding_noise_is_marked_after_the_claims_parts():
    """A mitigation's mechanism decided by a comparison whose low end lies 0.003 above its bound -0.1 (the noise's
    reach 0.04): moved down by the reach it reads inconclusive, so it is said, after the claim's own part; one 0.06
    above is not; a NaN interval never; a claim reading no decoded score still has its mechanism's said (broken on
    purpose: the mechanism's comparisons not read -> unmarked)."""
    noise = Noise(
        pd.DataFrame(
            {"query": ["attack"] * 2, "same_response": [False] * 2, "parted_at": [3, 5], "refused_delta": [0.1, -0.1]}
        )
    )
    what = "r = 0.6: attack refused, fair - uncompressed"
    restored = lambda e: verdicts.PAPERS if verdicts.decide(e, above=-0.1) == HOLDS else INCONCLUSIVE

    def measured(low: float, part: Estimate | None = None) -> Measured:
        back, part = Estimate(-0.05, low, 0.0, 100), part or Estimate(-0.1, -0.14, -0.06, 100)
        moved = lambda index, by: restored(Estimate(back.value + by, back.low + by, back.high + by, 100))
        mechanism = claims.Mechanism(restored(back), "refusal restored", (), ((what, "refused", back),), moved)
        return Measured([Part("change", part)], "x", 100, mechanism=mechanism)

    reading, near = claim(score="refused", mitigation="fair"), Estimate(-0.05, -0.09, -0.01, 100)
    assert claims.near_noise(reading, measured(-0.097, near), noise) == (
        "within decoding noise (refused): change 0.01 from its threshold (reach 0.04); "
        f"{claims.MECHANISM_NOISE}{what} -0.05 [-0.10, +0.00], moved by 0.04: {INCONCLUSIVE}"
    )
    assert claims.near_noise(reading, measured(-0.04), noise) == ""
    assert claims.near_noise(reading, measured(float("nan")), noise) == ""
    unscored = claims.near_noise(claim(score="", mitigation="fair"), measured(-0.097, near), noise)
    assert unscored.startswith(claims.MECHANISM_NOISE)


def test_numbers_print_small_values_visibly_and_rounding_noise_as_zero():
    """A bound near zero keeps a digit (+0.003, not +0.00); a mean of paired differences that cancel exactly, which a
    float sum leaves at about 1e-18, prints as 0 (a table once read "change -2e-18")."""
    assert verdicts.number(0.2234) == "0.22" and verdicts.number(0.003, "+") == "+0.003"
    assert verdicts.number(-0.00004, "+") == "-4e-05"
    assert verdicts.number(-2e-18, "+") == "+0.00" and verdicts.number(-2e-18) == "0.00"
    changes = np.array([0.1, 0.2, -0.3, 0.1, -0.1, 0.2, -0.2])  # cancel exactly; their float mean does not
    assert changes.mean() != 0 and verdicts.number(changes.mean(), "+") == "+0.00"


def test_several_statistics_over_the_same_draws_equal_each_alone():
    """``resampled_each`` draws each bootstrap sample once for all its statistics (notebook 07's Pareto claim reads
    eight): each estimate equals ``resampled``'s for that statistic alone, interval included."""
    rows = pd.DataFrame([{"key": k % 12, "v": float(k % 5), "w": float(k % 3)} for k in range(36)])
    statistics = {"mean": lambda f: f["v"].mean(), "gap": lambda f: f["v"].mean() - f["w"].mean()}
    each = verdicts.resampled_each(rows, statistics)
    for name, statistic in statistics.items():
        alone = verdicts.resampled(rows, statistic)
        assert (each[name].value, each[name].low, each[name].high, each[name].n) == (
            alone.value,
            alone.low,
            alone.high,
            alone.n,
        )
    assert each["mean"].low < each["mean"].high and each["gap"].low != each["mean"].low


def _situation_examples():
    """A hand-built claim and measurement for each row of ``situations.SITUATIONS``, by its name's first words."""
    from fairkv.report.claims import Claim, Measured, Part

    drop = Claim("x.drop", "Fig 9", "lowers", "lower", below=0.0, region="a drop", margin=0.05, null="small")
    rise = Claim("x.rise", "Fig 4", "rises", "rise", above=0.0, region="a rise", margin=0.05, null="small")
    level = Claim("x.level", "Fig 4", "followed", "followed", above=0.5, region="followed", effect=False)
    judged = Claim(**{**rise.__dict__, "id": "x.judged", "judged": True})
    est = lambda value, low, high, n=100, method="newcombe": verdicts.Estimate(value, low, high, n, method)
    one = lambda claim, estimate, **kw: (claim, Measured([Part("part", estimate)], "", estimate.n, **kw))
    return {
        "the interval lies wholly inside": one(drop, est(-0.2, -0.3, -0.1)),
        "the interval lies wholly outside": one(drop, est(0.2, 0.1, 0.3)),
        "a null": one(drop, est(0.0, -0.03, 0.03)),
        "a rise claimed from a metric's floor": one(rise, est(-0.01, -0.04, 0.0)),
        "a drop or a restoration": one(drop, est(0.0, -0.01, 0.01), untestable="nothing to lower"),
        "a level claimed above a bar": one(level, est(0.28, 0.2, 0.37), untestable="wholly below the bar"),
        "a cost the paper's implementation": one(rise, est(0.0, -0.04, 0.05), untestable="no second pass"),
        "the paper's number lies wholly above": (
            Claim(**{**rise.__dict__, "id": "x.peak", "numbers": {"peak": claims.Number(0.5, "leakage")}}),
            Measured(
                [Part("part", est(0.1, 0.05, 0.15))],
                "",
                100,
                {"peak": est(0.1, 0.05, 0.15)},
                ceilings={"peak": est(0.2, 0.15, 0.25)},
            ),
        ),
        "the interval straddles": one(drop, est(-0.05, -0.15, 0.05)),
        "a statistic undefined": one(rise, est(float("nan"), float("nan"), float("nan"), method="bootstrap")),
        "a bootstrap over fewer": one(rise, est(0.5, 0.4, 0.6, n=4, method="bootstrap")),
        "a claim resting on the judge": one(judged, est(0.3, 0.2, 0.4), gate="the judge is too poor"),
        **_magnitude_examples(rise, judged, est),
    }


def _magnitude_examples(rise, judged, est) -> dict:
    """The magnitude rows' examples: a claim with one paper number (an effect: Table 1's H2O fair, +0.0064)."""
    from fairkv.report.claims import Claim, Measured, Part

    numbered = lambda claim, value: Claim(**{**claim.__dict__, "numbers": {"x": claims.Number(value, "score")}})
    sized = lambda estimate, **kw: Measured([Part("part", estimate)], "", 100, {"x": estimate}, **kw)
    return {
        "our interval is narrower": (numbered(rise, 0.0064), sized(est(0.006, 0.005, 0.007))),
        "the paper's number widened by the tolerance lies": (numbered(rise, 0.0064), sized(est(-0.01, -0.03, -0.001))),
        "the paper's number widened by the tolerance overlaps": (numbered(rise, 0.0064), sized(est(0.0, -0.02, 0.02))),
        "the claim's direction is untestable": (
            numbered(rise, 0.0064),
            sized(est(0.0, -0.01, 0.01), untestable="nothing to raise"),
        ),
        "the claim rests on the judge": (numbered(judged, 0.5), sized(est(0.3, 0.2, 0.4), gate="too poor")),
        "the paper gives no number": one_measured(rise, est(0.3, 0.2, 0.4)),
    }


def one_measured(claim, estimate):
    from fairkv.report.claims import Measured, Part

    return claim, Measured([Part("part", estimate)], "", estimate.n)


def _mechanism_examples() -> dict:
    """The mechanism rows' examples, read by ``mechanism.read`` from hand-built rows (``test_mechanism.rows``):
    uncompressed / base / fair attack refusals and benign refusals, of 100 prompts."""
    from test_mechanism import UNCOMPRESSED, rows

    from fairkv.studies import mechanism

    read = lambda refused, benign: mechanism.read(rows(refused, benign), "fair", 0.5, "streamingllm").verdict
    benign = {UNCOMPRESSED: 38, "base": 1, "fair": 36}
    return {
        "the base policy lost": read({UNCOMPRESSED: 97, "base": 0, "fair": 97}, benign),
        "the base lost the refusal": read({UNCOMPRESSED: 97, "base": 0, "fair": 70}, benign),
        "the mitigation lowers": read({UNCOMPRESSED: 97, "base": 7, "fair": 14}, benign),
        "the base policy kept": read({UNCOMPRESSED: 97, "base": 97, "fair": 97}, benign),
        "an interval its reading": read({UNCOMPRESSED: 97, "base": 0, "fair": 97}, {**benign, "fair": 46}),
        "a claim on no mitigation": _unjudged(),
    }


def _unjudged() -> str:
    """A claim on a mitigation whose direction is untestable: its mechanism is not judged."""
    from fairkv.report.claims import Claim, Measured, Mechanism, Part

    claim = Claim(
        "x.m", "Fig 8", "lowers", "lower", below=0.0, region="a drop", margin=0.05, null="s", mitigation="fair"
    )
    measured = Measured(
        [Part("part", verdicts.Estimate(0.0, -0.01, 0.01, 100, "newcombe"))],
        "",
        100,
        untestable="nothing to lower",
        mechanism=Mechanism(verdicts.PAPERS, "refusal restored"),
    )
    return claims.mechanism(claim, measured).verdict


def test_every_situation_gets_its_one_label():
    """Issue 66 item 5: each row of ``situations.SITUATIONS`` (printed in docs/results.md), on a hand-built claim, reads
    the table's label through the one function every page's verdicts come from (``claims.direction``, or
    ``claims.magnitude`` for a row on magnitude, ``mechanism.read`` for one on mechanism: issue 82); every row has its
    example (broken on purpose: a null read inconclusive in ``verdicts.decide`` fails the null's row)."""
    from fairkv.report import claims

    examples, mechanisms = _situation_examples(), _mechanism_examples()
    for situation in situations.SITUATIONS:
        if situation.verdict == "mechanism":
            (key,) = [k for k in mechanisms if situation.name.startswith(k)]
            assert mechanisms.pop(key) == situation.label, situation.name
            continue
        (key,) = [k for k in examples if situation.name.startswith(k)]
        claim, measured = examples.pop(key)
        read = claims.magnitude(claim, measured)[0] if situation.verdict == "magnitude" else None
        assert (read or claims.direction(claim, measured)) == situation.label, situation.name
    assert not examples and not mechanisms


def test_an_inconclusive_claim_says_from_its_rows_which_situation_left_it_undecided():
    """Each situation that reads inconclusive gives its why (``claims.undecided``): the part's numbers (the bound its
    interval straddles, its n) and the situation's phrase, which the bottom line counts; a claim that holds has none
    (broken on purpose: the straddled bound read from the wrong end fails)."""
    from fairkv.report import claims

    examples = _situation_examples()
    phrases = {
        "the interval straddles": ("part -0.05 [-0.15, +0.05] straddles 0.00", claims.UNDECIDED["straddles"]),
        "a statistic undefined": ("part undefined", claims.UNDECIDED["undefined"]),
        "a bootstrap over fewer": ("part over 4 prompt(s)", claims.UNDECIDED["few"]),
    }
    for key, (numbers, phrase) in phrases.items():
        (head, *_) = claims.line(*examples[key], family=1)
        assert head["verdict"] == verdicts.INCONCLUSIVE
        assert head["why"] == f"uncertain: {numbers}; {phrase}", head["why"]
    gated = claims.line(*examples["a claim resting on the judge"], family=1)[0]  # the gate's numbers: in ours
    assert gated["why"] == f"uncertain: {claims.UNDECIDED['gate']}" and "the judge is too poor" in gated["ours"]
    half = claims.Measured([claims.Part("part", verdicts.Estimate(0.45, 0.4, float("nan"), 100, "newcombe"))], "", 100)
    bar = examples["a level claimed above a bar"][0]  # above 0.5: [0.4, nan] neither inside nor outside
    assert claims.line(bar, half, family=1)[0]["why"] == f"uncertain: part undefined; {claims.UNDECIDED['undefined']}"
    level = claims.Claim("x.level", "Fig 4", "followed", "followed", below=0.5, region="under", effect=False)
    straddling = claims.Measured([claims.Part("part", verdicts.Estimate(0.45, 0.4, 0.55, 100, "newcombe"))], "", 100)
    assert "straddles 0.50" in claims.line(level, straddling, family=1)[0]["why"]
    assert claims.line(*examples["the interval lies wholly inside"], family=1)[0]["why"] == ""


def test_a_papers_number_above_this_models_ceiling_is_untestable_not_differs():
    """Issue 82: leakage of 0.12 [0.09, 0.16] against the paper's 0.50 to 0.55 differs, unless the positive control
    shows this model reaches no more than 0.21 [0.17, 0.25]: then the paper's number is untestable here. A ceiling that
    reaches the paper's lowest value leaves the comparison as it was; for a change, its smallest size is compared."""
    ours, reached = Estimate(0.12, 0.09, 0.16, 100), Estimate(0.21, 0.17, 0.25, 100)
    assert verdicts.magnitude(ours, (0.50, 0.55), "leakage") == verdicts.DIFFERS
    assert verdicts.magnitude(ours, (0.50, 0.55), "leakage", reached) == verdicts.UNTESTABLE
    assert verdicts.magnitude(ours, (0.50, 0.55), "leakage", Estimate(0.6, 0.5, 0.7, 100)) == verdicts.DIFFERS
    assert verdicts.magnitude(ours, (0.30, 0.35), "leakage", reached) == verdicts.UNTESTABLE
    assert verdicts.magnitude(ours, 0.25, "leakage", reached) == verdicts.TOO_UNCERTAIN  # 0.25: within 0.17-0.25
    change = Estimate(-0.08, -0.12, -0.04, 100)
    assert verdicts.magnitude(change, (-0.40, -0.35), "difference", reached) == verdicts.UNTESTABLE
    narrow = Estimate(-0.08, -0.10, -0.06, 100)  # narrower than the tolerance of a change of 0.10: half of it
    assert verdicts.magnitude(narrow, (-0.20, -0.10), "difference", reached) == verdicts.MATCHES
    assert verdicts.magnitude(change, (-0.05, 0.30), "difference", Estimate(0.0, 0.0, 0.01, 100)) == verdicts.MATCHES
    few = Estimate(0.21, 0.17, 0.25, 5)  # a bootstrap over five prompts: no interval, no ceiling
    assert verdicts.magnitude(ours, (0.50, 0.55), "leakage", few) == verdicts.DIFFERS
    assert verdicts.all_magnitudes([verdicts.DIFFERS, verdicts.UNTESTABLE]) == verdicts.UNTESTABLE
    assert verdicts.all_magnitudes([verdicts.MATCHES, verdicts.UNTESTABLE]) == verdicts.UNTESTABLE


def test_a_claims_line_above_this_models_ceiling():
    """The before -> after claim whose levels differ (before 0.12 against the paper's 0.50) reads untestable here in
    magnitude once the model's ceiling at that setting is 0.21 [0.17, 0.25]: its why names the number and the ceiling,
    and the README's phrase for it is the ceiling's conclusion; the direction is read as before."""
    change = Estimate(-0.08, -0.12, -0.04, 100)
    sizes = {"before": Estimate(0.12, 0.08, 0.16, 100), "after": Estimate(0.05, 0.04, 0.06, 100), "change": change}
    reached = Estimate(0.21, 0.17, 0.25, 100)
    plain = Measured([Part("change", change)], "x", 100, sizes, "model: echoes")
    assert one(claim(), plain)["magnitude"] == verdicts.DIFFERS
    line = one(claim(), replace(plain, ceilings=dict.fromkeys(sizes, reached)))
    assert (line["verdict"], line["magnitude"]) == (HOLDS, verdicts.UNTESTABLE)
    assert line["why"] == (
        "ceiling: before: the paper's 0.50, this model's ceiling 0.21 [0.17, 0.25], change: the paper's -0.40, this "
        f"model's ceiling 0.21 [0.17, 0.25]; {claims.ABOVE_CEILING}"
    )
    assert readme.reasons(line["why"]) == [f"ceiling: {claims.ABOVE_CEILING}"]
    assert one(claim(), replace(plain, ceilings=dict.fromkeys(sizes, Estimate(0.6, 0.5, 0.7, 100))))["magnitude"] == (
        verdicts.DIFFERS
    )
