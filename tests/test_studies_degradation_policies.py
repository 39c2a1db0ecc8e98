"""Notebooks 01 and 02's claims (``fairkv.studies.degradation``, Pitfall 1, Fig 2; ``fairkv.studies.policies``,
Pitfall 2, Fig 3) on hand-built benign rows with known answers: each prompt's instructions, one per IFEval class, are
followed below a cut-off per class, so that class accuracies, their ranking (rho) and prompt accuracy are known."""

from __future__ import annotations

import pandas as pd
import pytest

import fairkv.studies
from fairkv.report.claims import FINDING, heads
from fairkv.report.verdicts import FAILS, HOLDS, INCONCLUSIVE
from fairkv.studies import degradation, paper_vs_us, policies
from fairkv.studies.reading import RATE_MARGIN, RHO_MARGIN

CLASSES = ("change_case", "keywords", "punctuation", "startend")  # four IFEval classes, in the order of their cut-offs
POLICIES = ("streamingllm", "h2o", "snapkv", "tova", "knorm")


@pytest.fixture(autouse=True)
def _one_family(monkeypatch):
    """The Bonferroni family counts every study's claims; fixed here so these tests read these studies alone."""
    monkeypatch.setattr(fairkv.studies, "family", lambda: 30)


def benign_row(key, policy: str, ratio: float, classes, followed) -> dict:
    """One benign answer: an instruction of each of ``classes`` (``<class>:x``), each followed or not."""
    strict = [bool(ok) for ok in followed]
    return {
        "key": key,
        "query": "benign",
        "policy": policy,
        "variant": "base",
        "lam": 1.0,
        "order": "normal",
        "ratio": ratio,
        "instruction_ids": [f"{name}:x" for name in classes],
        "strict_list": strict,
        "prompt_strict": float(all(strict)),
    }


def cut(position: int, cutoffs) -> list[bool]:
    """The prompt at ``position`` follows class i's instruction when it lies below ``cutoffs[i]``."""
    return [position < limit for limit in cutoffs]


# ---- notebook 01 -------------------------------------------------------------------------------------------------

RISING = (17, 18, 19, 20)  # of 20 multi-instruction prompts, how many follow each class at r = 0: 0.85 ... 1.0
FALLING = (17, 12, 7, 2)  # ... and at r = 0.9, reordered: changes 0, -0.3, -0.6, -0.9 (spread 0.9, rho -1)


def degradation_rows(multi_at_top) -> pd.DataFrame:
    """StreamingLLM at r = 0 and 0.9. 40 single-instruction prompts, ten per class (``MIN_INSTRUCTIONS``), class i
    followed by 2 (i + 1) of its ten at both ratios (no change anywhere: spread 0, rho 1); 20 multi-instruction prompts,
    one instruction per class, class i followed by ``RISING[i]`` of them at r = 0 and ``multi_at_top[i]`` at r = 0.9."""
    rows = []
    for ratio in (0.0, 0.9):
        for key in range(40):
            i, j = key % len(CLASSES), key // len(CLASSES)
            rows.append(benign_row(key, "streamingllm", ratio, [CLASSES[i]], [j < 2 * (i + 1)]))
        cutoffs = RISING if ratio == 0.0 else multi_at_top
        for m in range(20):
            rows.append(benign_row(40 + m, "streamingllm", ratio, CLASSES, cut(m, cutoffs)))
    return pd.DataFrame(rows)


def test_multi_instruction_prompts_degrade_more_unevenly_and_reorder():
    """Multi-instruction prompts reordered at r = 0.9 (class accuracy changes 0, -0.3, -0.6, -0.9: spread 0.9; rho -1)
    against single ones kept (spread 0, rho 1): both claims hold, over the 60 prompts. A kind whose classes rest on
    fewer than ``MIN_INSTRUCTIONS`` instructions has no spread: the claim is undefined there, never read off a ratio
    that swings by whole units (broken on purpose: no minimum -> the small-class case below reads a spread)."""
    table = paper_vs_us(degradation, degradation_rows(FALLING))
    claims = heads(table).set_index("id")
    assert claims.index.tolist() == [claim.id for claim in degradation.CLAIMS]
    assert claims["verdict"].tolist() == [HOLDS, HOLDS] and (claims["n"] == 60).all()
    assert (claims["status"] == FINDING).all() and (claims["magnitude"] == "n.a.").all()
    assert "spread at r = 0.9: single 0.00, multi 0.90; multi - single +0.90" in claims.iloc[0]["ours"]
    assert "mean rho over r > 0: single 1.00, multi -1.00; single - multi +2.00" in claims.iloc[1]["ours"]
    assert claims["why"].tolist() == ["", ""]  # why is shown only when a claim fails or differs
    few = degradation_rows(FALLING)
    key = few["key"]
    few = few[((key < 40) & (key % 10 < 5)) | ((key >= 40) & (key < 45))]  # 5 instructions per class, either kind
    spread = heads(paper_vs_us(degradation, few)).set_index("id").loc[degradation.SPREAD.id]
    assert spread["verdict"] == INCONCLUSIVE and "single nan, multi nan" in spread["ours"]


def test_multi_instruction_prompts_kept_alike_is_a_null_with_why_from_the_rows():
    """Multi-instruction prompts that keep every class at r = 0.9: the spread and rho gaps are 0 in every draw, within
    the margins: both claims fail as nulls, and why says, from the rows, how many instructions each class rests on."""
    claims = heads(paper_vs_us(degradation, degradation_rows(RISING))).set_index("id")
    assert claims["verdict"].tolist() == [FAILS, FAILS]
    spread, rho = claims.loc[degradation.SPREAD.id], claims.loc[degradation.RHO.id]
    assert f"no effect, within +-{degradation.SPREAD_MARGIN:g}" in spread["ours"]
    assert f"no effect, within +-{RHO_MARGIN:g}" in rho["ours"]
    assert "rests on 10 to 20 instructions" in spread["why"] and spread["why"] == rho["why"]


# ---- notebook 02 -------------------------------------------------------------------------------------------------

KEPT = {  # per policy, of 20 prompts how many follow each class at r = 0.5 (at r = 0 every policy ``RISING``)
    "tova": (15, 16, 18, 20),  # prompt accuracy 0.75, ranking kept (rho 1)
    "h2o": (10, 12, 14, 16),  # 0.5, rho 1
    "snapkv": (10, 12, 14, 16),
    "streamingllm": (10, 12, 14, 16),
    "knorm": (8, 6, 4, 2),  # 0.1, ranking reversed (rho -1)
}


def policy_rows(kept: dict, n: int = 20) -> pd.DataFrame:
    rows = []
    for policy, cutoffs in kept.items():
        for ratio, limits in ((0.0, RISING), (0.5, cutoffs)):
            rows.extend(benign_row(key, policy, ratio, CLASSES, cut(key, limits)) for key in range(n))
    return pd.DataFrame(rows)


def test_tova_best_and_knorm_worst_are_one_line_each_paired_against_every_policy():
    """TOVA 0.75 against 0.5 (H2O, SnapKV, StreamingLLM) and 0.1 (K-Norm): TOVA best and K-Norm worst hold, each one
    line with its four comparisons below it; K-Norm's reversed ranking (rho -1 against 1) is the lowest."""
    table = paper_vs_us(policies, policy_rows(KEPT))
    claims = heads(table).set_index("id")
    assert claims.index.tolist() == [claim.id for claim in policies.CLAIMS]
    assert claims["verdict"].tolist() == [HOLDS, HOLDS, HOLDS] and (claims["n"] == 20).all()
    tova = table[table["id"] == policies.TOVA_BEST.id]
    assert tova["part"].tolist() == ["", "TOVA - H2O", "TOVA - K-Norm", "TOVA - SnapKV", "TOVA - StreamingLLM"]
    assert (tova["verdict"] == HOLDS).all() and "TOVA - H2O +0.25" in tova.iloc[0]["ours"]
    knorm = table[table["id"] == policies.KNORM_WORST.id]
    assert knorm["part"].tolist()[1:] == ["H2O - K-Norm", "SnapKV - K-Norm", "StreamingLLM - K-Norm", "TOVA - K-Norm"]
    rho = table[table["id"] == policies.KNORM_RHO.id]
    assert len(rho) == 5 and (rho["verdict"] == HOLDS).all()
    assert "K-Norm -1.00" in rho.iloc[0]["ours"] and "TOVA - K-Norm +2.00" in rho.iloc[0]["ours"]


def test_tova_below_one_policy_fails_the_line_and_says_the_ranking():
    """TOVA and H2O swapped: TOVA - H2O fails, so TOVA's line fails though it beats K-Norm; why gives this model's
    ranking, from the rows."""
    swapped = {**KEPT, "tova": KEPT["h2o"], "h2o": KEPT["tova"]}
    table = paper_vs_us(policies, policy_rows(swapped))
    tova = table[table["id"] == policies.TOVA_BEST.id].set_index("part")
    assert tova.loc["", "verdict"] == FAILS and tova.loc["TOVA - H2O", "verdict"] == FAILS
    assert tova.loc["TOVA - K-Norm", "verdict"] == HOLDS
    assert tova.loc["", "why"].startswith("model: over r > 0 this model's policies rank H2O 0.75 > ")
    assert heads(table).set_index("id").loc[policies.KNORM_WORST.id, "verdict"] == HOLDS
    assert policies.TOVA_BEST.margin == RATE_MARGIN and policies.KNORM_RHO.margin == RHO_MARGIN
