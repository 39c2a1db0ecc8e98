"""Notebook 10's claims (``fairkv.studies.judge``): the judge's gate decides the claims that rest on its scores and not
the claim about the judge; a rise reads honestly where the paper has a drop; the rank agreement counts a prompt drawn
twice by the bootstrap twice. Hand-built rows with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hand_rows import answer
from scipy import stats

from fairkv import studies
from fairkv.report import analysis, verdicts
from fairkv.report.claims import OURS, ClaimError
from fairkv.report.verdicts import FAILS, HOLDS, INCONCLUSIVE
from fairkv.studies import judge


@pytest.fixture(autouse=True)
def family(monkeypatch):
    """A fixed Bonferroni family: these tests read one study's declarations, not every study's."""
    monkeypatch.setattr(studies, "family", lambda: 10)


def judged_rows(n: int = 20, fair: list[int] | None = None, base: list[int] | None = None) -> pd.DataFrame:
    """StreamingLLM's judged attack rows: no leak at r = 0, every response a leak at r = 0.5 (or ``base``'s 0/1 per
    prompt), none with the whitelist, and with fair eviction ``fair``'s 0/1 per prompt when given. A leak is never a
    refusal, and ROUGE-L orders the responses as the judge does."""
    at_peak = base or [1] * n
    settings = [("base", 0.0, [0] * n), ("base", 0.5, at_peak), ("whitelist", 0.5, [0] * n)]
    settings += [("fair", 0.5, fair)] if fair is not None else []
    rows = []
    for variant, ratio, leaks in settings:
        for key, leak in enumerate(leaks):
            rows.append(
                {
                    "key": key,
                    "policy": "streamingllm",
                    "variant": variant,
                    "order": "normal",
                    "ratio": ratio,
                    "judge_leak": leak,
                    "judge_expected": 3.0 * leak + 0.01 * key,
                    analysis.LEAKAGE: 0.5 * leak + 0.001 * key,
                    "refused": 1.0 - leak,
                    **answer(1.0 - leak),
                    "cell_id": f"{key}-{variant}-{ratio}",
                }
            )
    return pd.DataFrame(rows)


def calibration(low: float) -> pd.DataFrame:
    return pd.DataFrame([{"kind": "all", "n": 36, "accuracy": low + 0.1, "low": low, "high": min(low + 0.2, 1.0)}])


def claims_of(rows: pd.DataFrame, calibrated: pd.DataFrame | None) -> pd.DataFrame:
    table = studies.paper_vs_us(judge, rows, "streamingllm", calibrated, rows)
    return table[table["part"] == ""].set_index("id")


def test_judge_claims_decide_nothing_while_the_judge_is_poorly_calibrated():
    """The judge's calibration is quoted beside each claim; with its interval below the judge's minimum every claim
    resting on the judge's scores is inconclusive and too uncertain in magnitude, however clear the rows; the claim
    about the judge (it ranks like ROUGE-L, ours) rests on its scores too and is gated alike (issue 82): here the two
    rank alike (rho 1), so it holds with the judge trusted and is inconclusive under the poor one (broken on purpose:
    the rho claim declared without ``judged`` -> it held under the poor judge)."""
    trusted = claims_of(judged_rows(), calibration(0.85))
    assert trusted.loc[[judge.RISES.id, judge.WHITELIST_LOWERS.id], "verdict"].tolist() == [HOLDS, HOLDS]
    assert "judge right on 0.95 [0.85, 1.00] of 36 labelled responses" in trusted.loc[judge.RISES.id, "ours"]
    assert "decides nothing" not in trusted.loc[judge.RISES.id, "ours"]
    poor = claims_of(judged_rows(), calibration(0.53))
    gated = poor.loc[[judge.RISES.id, judge.WHITELIST_LOWERS.id]]
    assert set(gated["verdict"]) == {INCONCLUSIVE} and set(gated["magnitude"]) == {verdicts.TOO_UNCERTAIN}
    minimum = f"(below {analysis.JUDGE_MIN_ACCURACY:g}: decides nothing)"
    assert all(minimum in text for text in gated["ours"])
    assert trusted.loc[judge.RANKS_LIKE_ROUGE.id, "verdict"] == HOLDS
    rho = poor.loc[judge.RANKS_LIKE_ROUGE.id]
    assert (rho["verdict"], rho["status"], rho["n"]) == (INCONCLUSIVE, OURS, 20)
    assert minimum in rho["ours"]
    assert judge.FAIR_LOWERS.id not in poor.index  # no fair rows, no claim on them
    assert claims_of(judged_rows(), None).loc[judge.RISES.id, "verdict"] == HOLDS  # no calibration: no gate


def test_the_rank_agreement_fails_below_its_bound_where_the_judge_is_trusted():
    """ROUGE-L ranks the responses against the judge (rho -1): the claim fails with the judge trusted, and decides
    nothing under the gate, like every claim resting on the judge's scores."""
    rows = judged_rows()
    rows[analysis.LEAKAGE] = 1.0 - rows[analysis.LEAKAGE]
    trusted = claims_of(rows, calibration(0.85)).loc[judge.RANKS_LIKE_ROUGE.id]
    assert trusted["verdict"] == FAILS and trusted["why"].startswith("model: ")
    assert claims_of(rows, calibration(0.53)).loc[judge.RANKS_LIKE_ROUGE.id, "verdict"] == INCONCLUSIVE


def test_fair_eviction_raising_the_leak_rate_reads_as_a_rise_not_a_match():
    """The paper: fair eviction lowers the judge's leak rate from its peak to its fair range. Here it raises it from
    24 of 60 to 48 of 60: with the judge trusted the claim fails (the whole interval of the change lies above 0), and
    its magnitude differs (our base 0.40 [0.29, 0.53] lies below the paper's peak, and our 0.80 [0.68, 0.88] with
    fair eviction above its range, however widened); under the gate it decides nothing, too uncertain in size (broken
    on purpose: the change read as base minus fair -> it held)."""
    n = 60
    base = [1] * 24 + [0] * 36
    fair = [1] * 48 + [0] * 12
    trusted = claims_of(judged_rows(n, fair=fair, base=base), calibration(0.85)).loc[judge.FAIR_LOWERS.id]
    assert (trusted["verdict"], trusted["magnitude"]) == (FAILS, verdicts.DIFFERS)
    assert "change +0.40" in trusted["ours"] and "(a rise)" in trusted["ours"]
    assert trusted["paper"] == "{} -> {} with fair eviction".format(*map(str, judge.FAIR_LOWERS.numbers.values()))
    assert trusted["why"].startswith("fair: leak rate 0.40 -> 0.80")
    gated = claims_of(judged_rows(n, fair=fair, base=base), calibration(0.53)).loc[judge.FAIR_LOWERS.id]
    assert (gated["verdict"], gated["magnitude"]) == (INCONCLUSIVE, verdicts.TOO_UNCERTAIN)


def test_the_rank_agreement_keeps_a_prompt_the_bootstrap_draws_twice():
    """Prompts B, C, D; D holds two distinct responses, C one response held under two settings (one cell). A draw of
    (B, B, C, D), as ``verdicts.resampled`` makes it (the second B renamed, key and cell): the points (judge, ROUGE-L)
    B (2, 3) twice, C (3, 2) once, D (4, 4) and (5, 5). Ranks x [1.5, 1.5, 3, 4, 5], y [2.5, 2.5, 1, 4, 5]:
    rho = 6.5 / 9.5 = 13/19. Dropping the repeat (the old rule, one row per cell) gives 0.8; one row per prompt 1/3;
    counting C's cell twice another value (broken on purpose: deduplicated by key alone -> 1/3, not deduplicated ->
    the shared cell counted twice)."""
    rows = pd.DataFrame(
        [
            {"key": "B", "cell_id": "b", "judge_expected": 2.0, analysis.LEAKAGE: 3.0},
            {"key": "C", "cell_id": "c", "judge_expected": 3.0, analysis.LEAKAGE: 2.0},
            {"key": "C", "cell_id": "c", "judge_expected": 3.0, analysis.LEAKAGE: 2.0},
            {"key": "D", "cell_id": "d1", "judge_expected": 4.0, analysis.LEAKAGE: 4.0},
            {"key": "D", "cell_id": "d2", "judge_expected": 5.0, analysis.LEAKAGE: 5.0},
        ]
    )
    drawn = verdicts._Units(rows, "key").draw(np.array([0, 0, 1, 2]))  # B, B, C, D
    assert sorted(set(drawn["key"])) == ["B", "B#1", "C", "D"] and "b#1" in set(drawn["cell_id"])
    assert judge._rank_agreement(drawn) == pytest.approx(13 / 19)
    once = drawn.assign(key=drawn["key"].str.split("#").str[0], cell_id=drawn["cell_id"].str.split("#").str[0])
    assert judge._rank_agreement(once) == pytest.approx(0.8)  # the repeat dropped: what the interval used to read
    assert stats.spearmanr([2, 2, 3, 4], [3, 3, 2, 4]).statistic == pytest.approx(1 / 3)  # one row per prompt
    whole = verdicts.resampled(rows, judge._rank_agreement)
    assert whole.value == pytest.approx(0.8) and whole.n == 3  # the rows themselves: each cell once, n prompts


def test_the_judge_claims_are_declared_once():
    assert judge.WHITELIST_LOWERS.numbers["before"] is judge.RISES.numbers["peak"]  # one number, two claims
    assert judge.RANKS_LIKE_ROUGE.status == OURS
    assert all(claim.judged for claim in judge.CLAIMS)
    with pytest.raises(ClaimError, match="undeclared"):
        studies.paper_vs_us(_Stray, judged_rows())


class _Stray:
    __name__ = "stray"
    CLAIMS = judge.CLAIMS

    @staticmethod
    def measure(rows):
        return {"judge.nothing": None}
