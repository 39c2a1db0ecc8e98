"""The claims of notebooks 05 (whitelist) and 06 (fair eviction), declared in ``fairkv.studies.whitelist`` and
``fairkv.studies.fair``, on hand-built rows with known answers. The paper's numbers are read from the declarations."""

from __future__ import annotations

import pandas as pd
import pytest
from hand_rows import answer

import fairkv.studies
from fairkv.report import analysis, verdicts
from fairkv.report.claims import OURS
from fairkv.report.verdicts import DIFFERS, FAILS, HOLDS, MATCHES, UNTESTABLE
from fairkv.studies import fair, mechanism, paper_vs_us, whitelist


@pytest.fixture(autouse=True)
def one_family(monkeypatch):
    """The Bonferroni family counts every study's claims; these tests read two studies alone."""
    monkeypatch.setattr(fairkv.studies, "family", lambda: 10)


def _level(number) -> float:
    """The middle of a declared paper number (a value or a range)."""
    value = number.value
    return sum(value) / 2 if isinstance(value, tuple) else value


def whitelist_rows(defense_base: float, n: int = 20) -> pd.DataFrame:
    """The whitelist study on ``n`` prompts, two policies, r in 0, 0.3, 0.6, 0.7. Directive leakage at r > 0 is the
    paper's before (base) and after (whitelist) of each policy, plus 0.01 (key % 3); the attack is refused at r = 0
    and with the whitelist, never by the base policy at r > 0. Defense leakage: 0.03 at r = 0 (the floor), 0.02 with
    the whitelist, ``defense_base`` without it at r > 0. Accuracy: key % 2 with and without the whitelist (no change)."""
    levels = {
        "streamingllm": whitelist.STREAMINGLLM_LEAKAGE.numbers,
        "snapkv": whitelist.SNAPKV_LEAKAGE.numbers,
    }
    rows = []
    for policy, numbers in levels.items():
        for variant in ("base", "whitelist"):
            for ratio in (0.0, 0.3, 0.6, 0.7):
                for key in range(n):
                    compressed = ratio > 0
                    leak = _level(numbers["before" if variant == "base" else "after"]) if compressed else 0.0
                    rows.append(
                        {
                            "key": key,
                            "policy": policy,
                            "variant": variant,
                            "order": "normal",
                            "ratio": ratio,
                            **answer(float(not compressed or variant == "whitelist")),
                            analysis.LEAKAGE: leak + 0.01 * (key % 3),
                            "refused": float(not compressed or variant == "whitelist"),
                            "leak_defense": 0.03
                            if not compressed
                            else (0.02 if variant == "whitelist" else defense_base),
                        }
                    )
                    rows.append(
                        {
                            "key": key,
                            "policy": policy,
                            "variant": variant,
                            "order": "normal",
                            "ratio": ratio,
                            "query": "benign",
                            "benign_refused": 0.0,
                            analysis.ACCURACY: float(key % 2),
                        }
                    )
    return pd.DataFrame(rows)


def test_whitelist_claims_on_hand_built_rows():
    """Leakage falls from the paper's before to its after (the change constant over prompts): holds, and each of the
    paper's numbers matches. The refusal claim is ours. Accuracy is unchanged on every prompt: Newcombe's interval of
    identical outcomes is [0, 0], inside +-RATE_MARGIN: holds. Defense leakage without the whitelist is far above the
    floor (0.30 against 0.03): the claim is testable and the drop holds."""
    claims = paper_vs_us(whitelist, whitelist_rows(defense_base=0.30)).set_index("id")
    for claim in (whitelist.STREAMINGLLM_LEAKAGE, whitelist.SNAPKV_LEAKAGE):
        row = claims.loc[claim.id]
        assert (row["verdict"], row["magnitude"], row["n"]) == (HOLDS, MATCHES, 20), claim.id
        assert row["paper"] == claim.paper_text and str(claim.numbers["before"]) in row["paper"]
        # the refusal raised (0 -> 1, as uncompressed), no benign query refused; yet over 20 prompts the interval of
        # the refusal against the uncompressed model's (+0.00 [-0.16, +0.16]) reaches past RATE_MARGIN (at least
        # partly restored), and so does the price's: undecided
        assert row["mechanism"] == verdicts.INCONCLUSIVE, claim.id
        said = (
            f"{mechanism.AT_LEAST_PARTLY}, {mechanism.PRICE_UNDECIDED}: attack refused 0.00 -> 1.00 (uncompressed 1.00"
        )
        assert said in row["why"], claim.id
    refusing = claims.loc[whitelist.KEEPS_REFUSING.id]
    assert (refusing["verdict"], refusing["status"], refusing["magnitude"]) == (HOLDS, OURS, verdicts.NOT_APPLICABLE)
    assert "r = 0.7" in refusing["ours"]  # the largest ratio the whitelist runs at
    accuracy = claims.loc[whitelist.ACCURACY_UNCHANGED.id]
    assert accuracy["verdict"] == HOLDS and "change +0.00 [+0.00, +0.00]" in accuracy["ours"]
    defense = claims.loc[whitelist.DEFENSE_LEAKAGE.id]
    assert defense["verdict"] == HOLDS and "untestable" not in defense["ours"]
    assert "change -0.28 [-0.28, -0.28]" in defense["ours"]


def test_whitelist_defense_claim_is_untestable_at_the_floor():
    """Defense leakage without the whitelist is 0.04 at 0 < r < 0.6, within LEAK_MARGIN (0.02) of its floor, what the
    answers that refuse score of the defense (0.03 uncompressed, 0.02 with the whitelist: 0.024 per prompt, issue 82):
    nothing to lower, so the claim reads untestable here in direction and in magnitude, with the reason computed from
    the rows (both numbers in it), and its why from the rows too (broken on purpose: the floor read from every answer
    at r = 0 -> 0.03 said)."""
    claims = paper_vs_us(whitelist, whitelist_rows(defense_base=0.04)).set_index("id")
    defense = claims.loc[whitelist.DEFENSE_LEAKAGE.id]
    assert (defense["verdict"], defense["magnitude"], defense["n"]) == (UNTESTABLE, UNTESTABLE, 20)
    assert "untestable here: defense leakage" in defense["ours"]
    assert (
        "is 0.04 [0.04, 0.04] without the mitigation, below or within 0.02 of what the answers that refuse score "
        "of it, 0.02 [0.02, 0.02]: nothing to lower" in defense["ours"]
    )
    assert "0.03 [0.03, 0.03] uncompressed, and 0.02 [0.02, 0.02] in the answers that refuse" in defense["why"]
    # a floor lower makes it testable again: the same rows, the refusals uncompressed scoring 0.01 (the floor 0.016)
    lower = whitelist_rows(defense_base=0.04)
    lower.loc[lower["ratio"] == 0, "leak_defense"] = 0.01
    moved = paper_vs_us(whitelist, lower).set_index("id").loc[whitelist.DEFENSE_LEAKAGE.id]
    assert moved["verdict"] == FAILS  # testable now: 0.02 - 0.04 = -0.02 on every prompt, within the margin: negligible


def fair_rows(order: str, variants, n_attack: int = 20, n_benign: int = 10, leak=None) -> pd.DataFrame:
    """Rows of the fair-eviction study in one order: attack rows (directive leakage) on ``n_attack`` prompts, benign
    rows (accuracy) on the first ``n_benign``, as the cpu profile runs its two sides. StreamingLLM's accuracy at every
    r > 0: 1 base / 0.5 fair in the normal order, 0 base / 0.5 fair flipped; fair halves leakage everywhere (0.4 ->
    0.2), unless ``leak`` ({policy: (base, variant)}) sets a policy's levels at r > 0."""
    accuracy = {("normal", "base"): 1.0, ("flipped", "base"): 0.0}
    leak = leak or {}
    rows = []
    for policy in ("streamingllm", "snapkv"):
        for variant in variants:
            for ratio in (0.0, 0.4, 0.5, 0.6, 0.7):
                for key in range(n_attack):
                    base, other = leak.get(policy, (0.4, 0.2))
                    level = 0.0 if ratio == 0 else (base if variant == "base" else other)
                    rows.append(
                        {
                            "key": key,
                            "policy": policy,
                            "variant": variant,
                            "order": order,
                            "ratio": ratio,
                            **answer(0.0),
                            analysis.LEAKAGE: level + 0.01 * (key % 3),
                            "refused": 0.0,
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
                            "benign_refused": 0.0,
                            analysis.ACCURACY: accuracy.get((order, variant), 0.5),
                        }
                    )
    return pd.DataFrame(rows)


def test_fair_eviction_claims_count_the_prompts_of_their_own_side():
    """Leakage claims read the 20 attack prompts; the order-gap part reads accuracy, which only 10 prompts have: its
    n is 10 (a bootstrap over all 20 would draw prompts without accuracy and report n = 20). The gap shrinks from 1 to
    0 on every prompt and fair eviction halves leakage in each order: those parts hold; it refuses no attack, as the
    base does not, and 20 prompts cannot tell that from a drop of more than RATE_MARGIN (Newcombe's interval of no
    change is about +-0.16 there): those parts, and so the claim, are inconclusive. Table 1 reads both sides: its n is
    the 10 prompts both hold."""
    claims = paper_vs_us(
        fair, fair_rows("normal", ("base", "whitelist", "fair")), fair_rows("flipped", ("base", "fair"))
    )
    heads = claims[claims["part"] == ""].set_index("id")
    leakage = heads.loc[fair.STREAMINGLLM_LEAKAGE.id]
    assert (leakage["n"], leakage["verdict"]) == (20, HOLDS)
    gap = heads.loc[fair.ORDER_GAP.id]
    assert (gap["n"], gap["verdict"]) == (10, verdicts.INCONCLUSIVE)
    assert "gap base - gap fair +1.00 [+1.00, +1.00]" in gap["ours"]
    parts = claims[(claims["id"] == fair.ORDER_GAP.id) & (claims["part"] != "")].set_index("part")["verdict"]
    assert parts.to_dict() == {
        "normal: directive leakage, fair - base": HOLDS,
        "normal: attack refused, fair - base": verdicts.INCONCLUSIVE,
        "flipped: directive leakage, fair - base": HOLDS,
        "flipped: attack refused, fair - base": verdicts.INCONCLUSIVE,
        "gap base - gap fair": HOLDS,
    }
    claims = claims.set_index("id")
    table1 = claims.loc[[fair.TABLE1_POSITIVE.id]]
    assert table1.iloc[0]["n"] == 10 and (table1["n"] == 10).all()


def test_table1_is_one_claim_with_a_part_per_policy_and_variant():
    """Every composite score is 0.5 (0.5 - 1) + 0.5 (0.4 - 0.2) = -0.15 on every prompt: each part fails, so the one
    claim fails; its parts are listed under it, one per policy and variant (2 x 2 here), each with its n. The paper's
    entries come from ``TABLE1``, the one declaration that ``table1_beside`` also prints, std beside."""
    claims = paper_vs_us(
        fair, fair_rows("normal", ("base", "whitelist", "fair")), fair_rows("flipped", ("base", "fair"))
    )
    table1 = claims[claims["id"] == fair.TABLE1_POSITIVE.id]
    head, parts = table1.iloc[0], table1.iloc[1:]
    assert head["part"] == "" and head["verdict"] == FAILS and head["magnitude"] == DIFFERS
    assert sorted(parts["part"]) == ["SnapKV fair", "SnapKV whitelist", "StreamingLLM fair", "StreamingLLM whitelist"]
    assert (parts["verdict"] == FAILS).all() and parts["ours"].str.endswith("-0.15 [-0.15, -0.15]").all()
    assert "whitelist moves accuracy by -0.500 and leakage by -0.200 (a mean score of -0.150)" in head["why"]
    for (policy, variant), (mean, _) in fair.TABLE1.items():
        assert fair.TABLE1_POSITIVE.numbers[f"{policy}_{variant}"] is mean
    ours = analysis.table1(fair_rows("normal", ("base", "whitelist", "fair")).assign(lam=1.0), fair.TABLE1_RATIOS)
    beside = fair.table1_beside(ours).set_index(["policy", "variant"])
    mean, std = fair.TABLE1[("snapkv", "fair")]
    assert beside.loc[("SnapKV", "fair"), "paper (Llama-3.1-8B)"] == f"{mean.value:+.4f} ± {std:.4f}"


def test_snapkv_fair_matches_on_the_change_while_its_levels_differ():
    """SnapKV's leakage sits 0.3 below the paper's before and after, and falls by exactly the paper's change: the
    change matches, both levels differ, and the line says so (the claim's magnitude: differs)."""
    numbers = fair.SNAPKV_LEAKAGE.numbers
    before, after = _level(numbers["before"]) - 0.3, _level(numbers["after"]) - 0.3
    claims = paper_vs_us(
        fair,
        fair_rows("normal", ("base", "whitelist", "fair"), leak={"snapkv": (before, after)}),
        fair_rows("flipped", ("base", "fair")),
    ).set_index("id")
    snapkv = claims.loc[fair.SNAPKV_LEAKAGE.id]
    assert (snapkv["verdict"], snapkv["magnitude"]) == (HOLDS, DIFFERS)
    assert "the paper's numbers: change matches; before, after differs" in snapkv["ours"]
    assert snapkv["why"].startswith(
        "model: at r = 0.7 the attack answers (n = 20) refuse in any wording 0.00, recite the prompt 0.00, echo"
    )
