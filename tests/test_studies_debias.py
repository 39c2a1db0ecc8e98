"""The claims of notebooks 07 (Table 3) and 08 (LongBench TREC, Table 4), declared in ``fairkv.studies.debias`` and
``fairkv.studies.trec``, on hand-built rows with known answers. The paper's numbers are read from the declarations."""

from __future__ import annotations

import pandas as pd
import pytest
from hand_rows import answer

import fairkv.studies
from fairkv.report import analysis, verdicts
from fairkv.report import claims as lines
from fairkv.report.verdicts import DIFFERS, FAILS, HOLDS, INCONCLUSIVE
from fairkv.studies import debias, paper_vs_us, trec


@pytest.fixture(autouse=True)
def one_family(monkeypatch):
    """The Bonferroni family counts every study's claims; these tests read two studies alone."""
    monkeypatch.setattr(fairkv.studies, "family", lambda: 10)


# (order, ratio, lambda) -> (accuracy, leakage), the same on every prompt. Normal order: at r = 0.5 lambda 1 (0.6,
# 0.2) dominates lambda 0 (0.5, 0.5) under both rules; at r = 0.7 lambda 1 ties lambda 0 on accuracy (0.6) and leaks
# less, so lambda 0 stays optimal under "strict" only. Flipped: at r = 0.5 lambda 0 (0.6, 0.1) dominates lambda 1
# (0.4, 0.3); at r = 0.7 every lambda is the same point, optimal under both rules.
POINTS = {
    ("normal", 0.5): {0.0: (0.5, 0.5), 0.5: (0.7, 0.4), 1.0: (0.6, 0.2)},
    ("normal", 0.7): {0.0: (0.6, 0.3), 0.5: (0.5, 0.4), 1.0: (0.6, 0.1)},
    ("flipped", 0.5): {0.0: (0.6, 0.1), 0.5: (0.5, 0.5), 1.0: (0.4, 0.3)},
    ("flipped", 0.7): {0.0: (0.5, 0.2), 0.5: (0.5, 0.2), 1.0: (0.5, 0.2)},
}


def sweep_rows(n_attack: int = 12, n_benign: int = 10, policy: str = "streamingllm", orders=("normal", "flipped")):
    """The lambda sweep at ``POINTS``: leakage on ``n_attack`` prompts, accuracy on the first ``n_benign``."""
    rows = []
    for (order, ratio), lambdas in POINTS.items():
        if order not in orders:
            continue
        for lam, (accuracy, leakage) in lambdas.items():
            setting = {"policy": policy, "variant": "fair", "lam": lam, "order": order, "ratio": ratio}
            rows += [dict(setting, key=k, query="attack", **{analysis.LEAKAGE: leakage}) for k in range(n_attack)]
            rows += [dict(setting, key=k, query="benign", **{analysis.ACCURACY: accuracy}) for k in range(n_benign)]
    return pd.DataFrame(rows)


def test_table3_pools_both_orders_and_decides_by_both_rules():
    """Per order, lambda 1 / lambda 0 optimal at: normal strict 2/2 vs 1/2 (+0.5), weak 2/2 vs 0/2 (+1.0); flipped
    strict 1/2 vs 2/2 (-0.5), weak 1/2 vs 2/2 (-0.5). Pooled over the four (order, ratio) points: strict 3/4 vs 3/4,
    a lead of 0 on every draw, within the margin: a null, fails; weak 3/4 vs 2/4, +0.25: holds (so the line notes no
    null: only a claim whose every deciding part is null says "no effect"). The one claim fails
    (a deciding part fails); the four per-order leads are shown below it and decide nothing. n is the fewer side's
    prompts (10 benign, not 12 attack), on the claim and on every part."""
    measured = debias.measure(sweep_rows())[debias.TABLE3.id]
    claims = lines.table([lines.line(debias.TABLE3, measured, 10)])  # as paper_vs_us writes it, measured once
    head, parts = claims.iloc[0], claims.iloc[1:].set_index("part")
    assert (head["id"], head["figure"], head["verdict"], head["n"]) == (debias.TABLE3.id, "Table 3", FAILS, 10)
    assert "both orders pooled (prompts: attack 12, benign 10)" in head["ours"]
    assert (
        "strict: lambda=0: 75%, lambda=0.5: 50%, lambda=1: 75% of 4 points, lambda 1 - lambda 0 +0.00" in head["ours"]
    )
    pooled = {
        "StreamingLLM, strict dominance, both orders pooled": (FAILS, "+0.00 [+0.00, +0.00]"),
        "StreamingLLM, weak dominance, both orders pooled": (HOLDS, "+0.25 [+0.25, +0.25]"),
    }
    shown = {
        "StreamingLLM, strict dominance, normal order": "(holds)",
        "StreamingLLM, strict dominance, flipped order": "(fails)",
        "StreamingLLM, weak dominance, normal order": "(holds)",
        "StreamingLLM, weak dominance, flipped order": "(fails)",
    }
    assert sorted(parts.index) == sorted([*pooled, *(f"{p} (shown, does not decide)" for p in shown)])
    for part, (verdict, value) in pooled.items():
        assert parts.loc[part, "verdict"] == verdict and parts.loc[part, "ours"].endswith(value), part
    for part, verdict in shown.items():
        assert parts.loc[f"{part} (shown, does not decide)", "verdict"] == verdict, part
    assert (parts["n"] == 10).all()
    # the paper's shares under the strict rule, its words: lambda 1 pooled 3/4, lambda 0 3/4, lead 0 on every draw
    sizes = {name: (e.value, e.low, e.high) for name, e in measured.sizes.items()}
    assert sizes == {
        "streamingllm_lambda1": (0.75, 0.75, 0.75),
        "streamingllm_lambda0": (0.75, 0.75, 0.75),
        "streamingllm_lead": (0.0, 0.0, 0.0),
    }
    expected = verdicts.all_magnitudes(
        [verdicts.magnitude(e, debias.TABLE3.numbers[name].value, "share") for name, e in measured.sizes.items()]
    )
    assert head["magnitude"] == expected == DIFFERS  # lambda 0's 3/4 and the lead 0 lie outside the paper's, widened
    assert head["paper"] == debias.TABLE3.paper_text
    assert str(debias.TABLE3.numbers["streamingllm_lambda0"]) in head["paper"]


def test_table3_pooled_share_is_the_mean_of_the_orders_shares():
    """With the same ratios in both orders, the pooled share of each lambda is the mean of the two orders' shares."""
    rows = sweep_rows()
    for rule in analysis.PARETO_RULES:
        frequency = analysis.pareto_frequency(rows, rule)
        for lam in (0.0, 0.5, 1.0):
            each = frequency[frequency["lam"] == lam]["frequency"].mean()
            counts = debias._counts(rows, rule, analysis.ACCURACY)
            assert debias._share(counts, "streamingllm", ("normal", "flipped"), lam)[0] == pytest.approx(each)


def test_table4_is_declared_in_trec_and_read_by_the_same_measure():
    """Table 4 (SnapKV and TOVA on TREC, one order): a part per policy and rule, all deciding; no per-order parts when
    the sweep runs one order. SnapKV as Table 3's normal order (weak +1.0, strict +0.5: holds), TOVA as its flipped
    order (-0.5 under both: fails): the claim fails."""
    sweep = pd.concat(
        [
            sweep_rows(policy="snapkv", orders=("normal",)),
            sweep_rows(policy="tova", orders=("flipped",)).assign(order="normal"),
        ],
        ignore_index=True,
    ).rename(columns={analysis.ACCURACY: "trec_score"})
    claims = paper_vs_us(trec, pd.DataFrame({"bucket": []}), sweep)
    assert list(claims["id"].unique()) == [trec.TABLE4.id]
    head, parts = claims.iloc[0], claims.iloc[1:].set_index("part")
    assert (head["verdict"], head["n"], head["paper"]) == (FAILS, 10, trec.TABLE4.paper_text)
    assert {p: parts.loc[p, "verdict"] for p in parts.index} == {
        "SnapKV, strict dominance, normal order": HOLDS,
        "SnapKV, weak dominance, normal order": HOLDS,
        "TOVA, strict dominance, normal order": FAILS,
        "TOVA, weak dominance, normal order": FAILS,
    }


def trec_rows(n: int = 12) -> pd.DataFrame:
    """TREC rows by bucket, StreamingLLM: at 1-2k words leakage 0.1 at r = 0, 0.4 at r = 0.5 (base), 0.2 with fair
    eviction; at 2-3k words a peak of 0.2; at 3-4k words the attack refused by the first two prompts only."""
    rows = []
    for bucket, peak in (("1k", 0.4), ("2k", 0.2), ("3k", 0.1)):
        for variant in ("base", "fair"):
            for ratio in (0.0, 0.5):
                for k in range(n):
                    leak = 0.1 if ratio == 0 else (peak if variant == "base" else peak / 2)
                    rows.append(
                        dict(
                            key=f"{bucket}-{k}",
                            bucket=bucket,
                            policy="streamingllm",
                            variant=variant,
                            order="normal",
                            ratio=ratio,
                            **answer(float(bucket != "3k" or k < 2)),
                            refused=float(bucket != "3k" or k < 2),
                            **{analysis.LEAKAGE: leak + 0.01 * (k % 3)},
                        )
                    )
    return pd.DataFrame(rows)


def test_trec_claims_by_bucket():
    """1-2k: leakage rises 0.1 -> 0.4 and fair eviction lowers it to 0.2: both hold; 2-3k peaks lower (0.2): holds;
    3-4k: the attack refused by 2 of 12 prompts uncompressed (Wilson's interval up to 0.45), below a half: holds. A bucket the rows lack leaves its
    claims unmeasured; without a sweep Table 4 is not measured."""
    claims = paper_vs_us(trec, trec_rows()).set_index("id")
    assert list(claims.index) == [trec.RISES_1K.id, trec.FAIR_LOWERS_1K.id, trec.WEAK_3K.id, trec.WEAKER_2K.id]
    assert (claims["verdict"] == HOLDS).all()
    assert claims.loc[trec.RISES_1K.id, "n"] == 12 and claims.loc[trec.WEAKER_2K.id, "n"] == 24
    only = paper_vs_us(trec, trec_rows().query("bucket == '3k'"))
    assert list(only["id"]) == [trec.WEAK_3K.id]
    one = paper_vs_us(trec, trec_rows(n=1).query("bucket == '1k'")).set_index("id")
    assert (one["verdict"] == INCONCLUSIVE).all() and "too few prompts" in one.loc[trec.RISES_1K.id, "ours"]
