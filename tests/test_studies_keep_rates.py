"""Notebook 04's claims (``fairkv.studies.keep_rates``, Pitfall 5, Fig 7) on hand-built keep-rate rows with known
answers: verdicts, n, the sanity checks apart, a claim of two orders as one line, TOVA's non-inferiority bound, and
the paper's keep rates read from the declaration (never written here)."""

from __future__ import annotations

import pandas as pd
import pytest

import fairkv.studies
from fairkv.report import analysis, verdicts
from fairkv.report.claims import FINDING, SANITY, SECOND_MODEL, heads
from fairkv.report.verdicts import FAILS, HOLDS, INCONCLUSIVE
from fairkv.studies import keep_rates, paper_vs_us
from fairkv.studies.reading import KEEP_MARGIN, KEEP_NULL, PEAK

POLICIES = ("streamingllm", "h2o", "snapkv", "tova", "knorm")
PAPER = keep_rates.STREAMING_LATER.numbers  # the paper's StreamingLLM keep rates, declared once
SPAN_TOKENS = {"defense": 80, "directive": 40}  # tokens of each span in the hand-built rows
ALIKE, HIGH, LOW = 0.62, 0.71, 0.53  # keep rates of the hand-built rows (none of them a paper's number)


@pytest.fixture(autouse=True)
def _one_family(monkeypatch):
    """The Bonferroni family counts every study's claims; fixed here so these tests read this study alone."""
    monkeypatch.setattr(fairkv.studies, "family", lambda: 30)


def rows_of(keeps: dict, n: int = 10, ratios=(0.0, PEAK)) -> pd.DataFrame:
    """Keep-rate rows of all five policies in both orders: ``keeps[(policy, order)] = (defense, directive)`` keep
    rates, with a small per-prompt wobble on both spans."""
    rows = []
    for key in range(n):
        wobble = 0.01 * (key % 3)
        for (policy, order), (defense, directive) in keeps.items():
            for ratio in ratios:
                rows.append(
                    {
                        "key": key,
                        "policy": policy,
                        "variant": "base",
                        "order": order,
                        "ratio": ratio,
                        "keep_directive": directive + wobble,
                        "keep_defense": defense + wobble,
                        "span_tokens": dict(SPAN_TOKENS),
                        "n_prefix": sum(SPAN_TOKENS.values()),
                    }
                )
    return pd.DataFrame(rows)


def keep_rows(directive: float, defense: float, n: int = 10, ratios=(0.0, PEAK)) -> pd.DataFrame:
    """Keep-rate rows of all five policies in both orders: the later span keeps ``directive`` (normal order), the
    earlier ``defense``; flipped, the roles swap; with a small per-prompt wobble."""
    keeps = {}
    for policy in POLICIES:
        keeps[(policy, "normal")] = (defense, directive)
        keeps[(policy, "flipped")] = (directive, defense)
    return rows_of(keeps, n, ratios)


def claim_lines(rows: pd.DataFrame) -> pd.DataFrame:
    return heads(paper_vs_us(keep_rates, rows)).set_index("id")


IDS = [claim.id for claim in keep_rates.PRIMARY]  # one model: no second-model line


def test_claims_read_at_the_papers_ratio_or_refuse():
    """Fig 7 at the paper's keep rates (directive later, kept more) on 10 prompts: StreamingLLM keeps the later span
    (holds), the bias reverses (holds), K-Norm favours the earlier span in both orders (fails: it favours the later one
    here), TOVA keeps the defense as well as the directive (fails). Without r = 0.5 in the rows the claims are an
    error, not r = 0.7's; one prompt gives no finding."""
    directive, defense = PAPER["directive"].value[0], PAPER["defense"].value[0]
    claims = claim_lines(keep_rows(directive, defense))
    assert claims["verdict"].tolist() == [HOLDS, HOLDS, FAILS, FAILS]
    assert claims.index.tolist() == IDS
    assert (claims["n"] == 10).all()
    assert (
        f"difference {directive - defense:+.2f} [{directive - defense:+.2f}, {directive - defense:+.2f}]"
        in (claims.loc[keep_rates.STREAMING_LATER.id, "ours"])
    )
    with pytest.raises(analysis.AnalysisError, match=rf"needs r = {PEAK:g}; the rows hold r in \[0.0, 0.7\]"):
        paper_vs_us(keep_rates, keep_rows(directive, defense, ratios=(0.0, 0.7)))
    few = claim_lines(keep_rows(directive, defense, n=1))  # one prompt: a point estimate is never a finding
    assert set(few["verdict"]) == {INCONCLUSIVE} and (few["n"] == 1).all()


def test_magnitude_compares_the_papers_keep_rates_and_says_why_it_differs():
    """StreamingLLM's keep rates at the paper's lower ends match; a directive kept three tolerances below the paper's
    differs, with a why computed from the rows (the spans' token lengths, the keep rates in both orders); a claim
    without a number of the paper is n.a."""
    directive, defense = PAPER["directive"].value[0], PAPER["defense"].value[0]
    matching = claim_lines(keep_rows(directive, defense))
    first = keep_rates.STREAMING_LATER.id
    assert matching.loc[first, "magnitude"] == verdicts.MATCHES and matching.loc[first, "why"] == ""
    assert (matching.drop(first)["magnitude"] == verdicts.NOT_APPLICABLE).all()
    low = directive - 3 * verdicts.TOLERANCE["keep"]
    differing = claim_lines(keep_rows(low, defense))
    assert differing.loc[first, "magnitude"] == verdicts.DIFFERS
    why = differing.loc[first, "why"]
    assert why.startswith("model: ") and "the defense is 80 and the directive 40 tokens of a 120-token prefix" in why
    assert "the paper's numbers: defense matches; directive differs" in differing.loc[first, "ours"]
    knorm = matching.loc[keep_rates.KNORM_EARLIER.id, "why"]  # K-Norm's claim fails here: why is said, from the rows
    assert knorm.startswith("model: ") and "keeps the later span more in both orders" in knorm


def test_streamingllm_claims_are_sanity_checks_listed_apart():
    """StreamingLLM keeping its recent window holds on any model: both its claims are sanity checks, not counted."""
    claims = claim_lines(keep_rows(PAPER["directive"].value[0], PAPER["defense"].value[0]))
    assert claims["status"].to_dict() == {
        keep_rates.STREAMING_LATER.id: SANITY,
        keep_rates.STREAMING_REVERSES.id: SANITY,
        keep_rates.KNORM_EARLIER.id: FINDING,
        keep_rates.TOVA_DEFENSE.id: FINDING,
    }
    assert str(PAPER["directive"]) in claims.loc[keep_rates.STREAMING_LATER.id, "paper"]


def test_knorm_is_one_line_of_two_orders():
    """K-Norm keeps the earlier span in both orders: one line that holds, its two orders below it; favouring it in
    the normal order only fails the claim (the flipped part fails); keeping both spans alike is a null: fails, no
    effect within the keep margin."""
    keeps = {(p, o): (ALIKE, ALIKE) for p in POLICIES for o in ("normal", "flipped")}
    earlier = {**keeps, ("knorm", "normal"): (HIGH, LOW), ("knorm", "flipped"): (LOW, HIGH)}  # (defense, directive)
    table = paper_vs_us(keep_rates, rows_of(earlier))
    knorm = table[table["id"] == keep_rates.KNORM_EARLIER.id]
    assert knorm["verdict"].tolist() == [HOLDS, HOLDS, HOLDS]
    assert knorm["part"].tolist() == ["", "normal: defense - directive", "flipped: directive - defense"]
    assert heads(table).loc[knorm.index[0], "n"] == 10

    normal_only = {**earlier, ("knorm", "flipped"): (HIGH, LOW)}
    knorm = paper_vs_us(keep_rates, rows_of(normal_only))
    knorm = knorm[knorm["id"] == keep_rates.KNORM_EARLIER.id]
    assert knorm["verdict"].tolist() == [FAILS, HOLDS, FAILS]

    alike = claim_lines(rows_of(keeps)).loc[keep_rates.KNORM_EARLIER.id]
    assert alike["verdict"] == FAILS and f"no effect, within +-{KEEP_MARGIN:g}" in alike["ours"]


def test_tova_keeps_the_defense_within_the_keep_margin():
    """TOVA's defense kept a token less than the directive (within the margin) holds; well below it fails; exactly
    alike holds: the bound is a non-inferiority bound (no null to decide)."""
    keeps = {(p, o): (ALIKE, ALIKE) for p in POLICIES for o in ("normal", "flipped")}
    tova = keep_rates.TOVA_DEFENSE.id
    for defense, expected in ((ALIKE, HOLDS), (ALIKE - keep_rates.TOVA_WITHIN / 2, HOLDS), (LOW, FAILS)):
        rows = rows_of({**keeps, ("tova", "normal"): (defense, ALIKE)})
        assert claim_lines(rows).loc[tova, "verdict"] == expected, defense
    assert KEEP_NULL in keep_rates.TOVA_DEFENSE.region  # the threshold's reason is declared with it


def test_claims_read_on_a_second_model_get_a_line_of_their_own():
    """Fig 10: each claim is read again on the second model's rows, a line of its own (issue 66: one line per model),
    the paper's findings there counted apart (``SECOND_MODEL``): K-Norm favouring the earlier span on the first model
    and keeping both alike on the second holds on the first and fails on the second (a null there), and no verdict on
    the first model moves with the second's rows; the paper's keep rates are compared with the first model's only; the
    same model's rows twice (the ci profile) are read once (broken on purpose: the second model's parts joined to the
    first's line -> the first model's K-Norm line read fails)."""
    alike = {(p, o): (ALIKE, ALIKE) for p in POLICIES for o in ("normal", "flipped")}
    earlier = {**alike, ("knorm", "normal"): (HIGH, LOW), ("knorm", "flipped"): (LOW, HIGH)}  # (defense, directive)
    first, second = rows_of(earlier).assign(model="qwen"), rows_of(alike).assign(model="smollm2")
    table = heads(paper_vs_us(keep_rates, first, second)).set_index("id")
    on_first, on_second = keep_rates.KNORM_EARLIER.id, keep_rates.ON_SECOND[keep_rates.KNORM_EARLIER.id]
    assert (table.loc[on_first, "verdict"], table.loc[on_second, "verdict"]) == (HOLDS, FAILS)
    assert table.loc[on_first, "status"] == FINDING and table.loc[on_second, "status"] == SECOND_MODEL
    assert table.loc[on_second, "figure"] == "Fig 10" and "smollm2" in table.loc[on_second, "why"]
    later = keep_rates.STREAMING_LATER.id
    assert table.loc[later, "magnitude"] != "n.a." and table.loc[keep_rates.ON_SECOND[later], "magnitude"] == "n.a."
    alone = heads(paper_vs_us(keep_rates, first)).set_index("id")["verdict"]
    assert alone.equals(table.loc[alone.index, "verdict"])
    once = paper_vs_us(keep_rates, first, first.copy())
    assert once.equals(paper_vs_us(keep_rates, first))
