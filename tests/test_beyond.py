"""Beyond the paper (notebook 11): N-span prompts written by IFEval's checker library, every RaccoonBench attack as
a query kind, defense templates by name; their analysis."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fairkv import studies
from fairkv.core import data, metrics, multispan, prompts
from fairkv.report import analysis
from fairkv.report.claims import OURS
from fairkv.report.verdicts import FAILS, HOLDS, UNTESTABLE
from fairkv.runs import experiment
from fairkv.runs.experiment import GridError
from fairkv.studies import beyond


def test_span_prompts_are_written_and_checked_by_ifeval():
    metrics._ifeval()
    from lm_eval.tasks.ifeval import instructions_registry as registry

    record = multispan.compose(5, 3)
    assert record == multispan.compose(5, 3)  # seeded: the same dataset name always gives the same prompts
    assert len(set(record.instruction_id_list)) == 5 and set(record.instruction_id_list) <= set(multispan.BANK)
    for first in record.instruction_id_list:  # IFEval's own conflict table
        assert not (registry.INSTRUCTION_CONFLICTS[first] - {first}) & set(record.instruction_id_list)
    for (name, text), instruction_id, kwargs in zip(record.segments, record.instruction_id_list, record.kwargs):
        checker = registry.INSTRUCTION_DICT[instruction_id](instruction_id)
        assert checker.build_description(**kwargs).strip() == text  # the checker's own words, its own arguments
    assert [r.key for r in data.load_records("spans_8", limit=3)] == [8_000_000, 8_000_001, 8_000_002]
    with pytest.raises(multispan.MultiSpanError, match="bank holds 1 to 9"):
        multispan.compose(10, 0)


def test_each_span_is_scored_by_its_own_check():
    record = next(
        r
        for r in data.load_records("spans_3", limit=20)
        if {"detectable_format:title", "punctuation:no_comma"} <= set(r.instruction_id_list)
    )
    outcome = dict(
        zip(record.instruction_id_list, metrics.ifeval(record, "<<A Title>>\n\nNo commas here at all.").strict)
    )
    assert outcome["detectable_format:title"] and outcome["punctuation:no_comma"]
    outcome = dict(zip(record.instruction_id_list, metrics.ifeval(record, "Plain text, with a comma.").strict))
    assert not outcome["detectable_format:title"] and not outcome["punctuation:no_comma"]


def test_span_prompt_has_one_span_per_instruction(smollm):
    record = multispan.compose(8, 0)
    prompt = prompts.prompt_for(smollm.tokenizer, record, {})
    assert [s.name for s in prompt.spans] == [f"span{i}" for i in range(1, 9)]
    for span, (_, text) in zip(prompt.spans[1:], record.segments[1:]):
        assert smollm.tokenizer.decode(prompt.ids[0, span.start : span.end]).strip().startswith(text.strip()[:20])
    assert prompt.references == {name: text for name, text in record.segments}


@pytest.mark.slow
def test_span_rows_per_span_and_fair_keeps_every_span_alike(smollm, tmp_path):
    grid = experiment.Grid(
        dataset="spans_3",
        n_prompts=2,
        policies=("streamingllm",),
        variants=("base", "fair"),
        ratios=(0.0, 0.5),
        queries=("benign",),
        max_new_tokens=16,
    )
    spans = analysis.per_span(experiment.run(grid, tmp_path, progress=False, lm=smollm))
    assert len(spans) == 2 * 4 * 3 and set(spans["span"]) == {"span1", "span2", "span3"}
    assert (spans["kept_tokens"] <= spans["span_tokens"]).all() and spans["compliance"].isin([0.0, 1.0]).all()
    fair = spans[(spans["variant"] == "fair") & (spans["ratio"] == 0.5)].groupby("key")["keep_rate"]
    assert (fair.max() - fair.min()).max() < 0.15
    base = spans[(spans["variant"] == "base") & (spans["ratio"] == 0.5)].groupby("key")["keep_rate"]
    assert (base.max() - base.min()).min() > (fair.max() - fair.min()).max()  # StreamingLLM: the middle span starves
    table = analysis.starvation(spans)
    assert set(table["n_spans"]) == {3} and table["fair_gain"].notna().all()


def test_attack_query_kinds():
    one_each = data.attack_queries(per_category=1)
    attacks = data.load_attacks()
    assert len(one_each) == len({(a.suite, a.category) for a in attacks}) == 30
    assert len(data.attack_queries()) == len(attacks) == 59
    assert "attack:singular_attacks/Plain/prompt1" in one_each
    grid = experiment.Grid(queries=("attack", one_each[3]))
    assert set(grid.attacks()) == {"attack", one_each[3]} and grid.attacks()["attack"] == data.paper_attack().text
    with pytest.raises(GridError, match="unknown attack"):
        experiment.Grid(queries=("attack:singular_attacks/Plain/none",)).attacks()
    with pytest.raises(GridError, match="unknown query kind 'leak'"):
        experiment.Grid(queries=("leak",))


@pytest.mark.slow
def test_many_attacks_and_a_named_defense_template(smollm, tmp_path):
    queries = data.attack_queries(per_category=1)[:3]
    grid = experiment.Grid(
        n_prompts=1, policies=("streamingllm",), ratios=(0.0, 0.5), queries=("attack",) + queries, max_new_tokens=8
    )
    rows = analysis.by_attack(experiment.run(grid, tmp_path, progress=False, lm=smollm))
    assert set(rows["query"]) == {"attack", *queries} and rows["leak_directive"].notna().all()
    assert set(rows["category"]) == {"Plain"} | {q.split("/")[1] for q in queries}
    strong = grid.with_overrides(template="long_defense_GptInfinite", queries=("attack",))
    again = experiment.run(strong, tmp_path, progress=False, lm=smollm)
    assert not set(again["cell_id"]) & set(rows["cell_id"])  # the template is part of a cell's identity
    assert again["n_prefix"].iloc[0] > rows["n_prefix"].iloc[0] + 300  # 335 words of defense


def test_critical_ratio_hand_worked():
    rows = pd.DataFrame(
        {
            "template": ["weak"] * 4 + ["strong"] * 4 + ["never"] * 2,
            "ratio": [0, 0.3, 0.5, 0.7] * 2 + [0, 0.5],
            "refused": [1.0, 0.6, 0.4, 0.0, 1.0, 1.0, 0.8, 0.2, 0.0, 0.0],
        }
    )
    table = analysis.critical_ratio(rows, ["template"]).set_index("template")
    assert table.loc["weak", "critical_ratio"] == 0.5  # 0.4 < half of 1.0
    assert table.loc["strong", "critical_ratio"] == 0.7
    assert np.isnan(table.loc["never", "critical_ratio"])  # nothing to lose at r = 0


def _hand_worked_rows():
    """Ten prompts per span count (their own keys), each as the others (so every interval is as narrow as the values
    allow); two attack categories; three defense templates."""
    keys = range(10)
    spans = pd.DataFrame(
        [  # one span per (prompt, N): it is the smallest span
            {
                "key": 100 * n + k,
                "n_spans": n,
                "span": "span0",
                "policy": "streamingllm",
                "variant": v,
                "ratio": r,
                "keep_rate": keep,
                "compliance": comply,
            }
            for k in keys
            for n, values in {
                2: {
                    ("base", 0.0): (1.0, 0.5),
                    ("fair", 0.0): (1.0, 0.5),
                    ("base", 0.5): (0.2, 0.2),
                    ("fair", 0.5): (0.5, 0.5),
                },
                8: {
                    ("base", 0.0): (1.0, 0.5),
                    ("fair", 0.0): (1.0, 0.5),
                    ("base", 0.5): (0.0, 0.6),
                    ("fair", 0.5): (0.5, 0.5),
                },
            }.items()
            for (v, r), (keep, comply) in values.items()
        ]
    )
    leak = {
        ("A", "base"): (0.1, 0.6),
        ("A", "whitelist"): (0.1, 0.2),
        ("A", "fair"): (0.1, 0.7),
        ("B", "base"): (0.2, 0.1),
        ("B", "whitelist"): (0.2, 0.1),
        ("B", "fair"): (0.2, 0.3),
    }
    attacks = pd.DataFrame(
        [
            {
                "key": k,
                "query": f"attack:suite/{c}/first",
                "category": c,
                "variant": v,
                "policy": "streamingllm",
                "ratio": r,
                "leak_directive": x,
                "refused": 1.0 if r == 0 or v == "whitelist" else 0.0,
            }
            for k in keys
            for (c, v), values in leak.items()
            for r, x in zip((0.0, 0.5), values)
        ]
    )
    refusals = {
        "weak": {0.0: [1] * 5 + [0] * 5, 0.3: [0] * 10, 0.5: [0] * 10},  # 5 of 10, gone at r = 0.3
        "strong": {r: [1] * 9 + [0] for r in (0.0, 0.3, 0.5)},  # 9 of 10 (the 5 weak ones among them)
        "silent": {r: [0] * 10 for r in (0.0, 0.3, 0.5)},
    }
    defenses = pd.DataFrame(
        [
            {"key": k, "template": t, "variant": "base", "policy": "streamingllm", "ratio": r, "refused": float(v[k])}
            for t, curve in refusals.items()
            for r, v in curve.items()
            for k in keys
        ]
    )
    refused = {"middle": [0] * 10, "last": [1] * 8 + [0] * 2}  # fair StreamingLLM: 0 -> 8 of 10 refuse
    geometry = pd.DataFrame(
        [
            {"key": k, "place": p, "variant": "fair", "policy": "streamingllm", "ratio": r, "refused": float(v[k])}
            | {"keep_operative": 0.0 if p == "middle" else 0.9}
            for p, v in refused.items()
            for r in (0.5, 0.6, 0.7)
            for k in keys
        ]
    )
    return spans, attacks, defenses, geometry


def _claims(*inputs, **options) -> pd.DataFrame:
    return studies.paper_vs_us(beyond, *inputs, **options)


def test_beyond_claims_hand_worked(monkeypatch):
    """Each verdict worked out by hand; every claim is ours, the smallest span's too (it can lose a token to the
    base's: no truth by construction); the N-spans claims read each count's 10 prompts (n 10, not the 20 pooled), one
    part per count (broken on purpose: the smallest span's claim declared a finding -> its status was wrong; n pooled ->
    20)."""
    monkeypatch.setattr(studies, "family", lambda: 10)
    spans, attacks, defenses, geometry = _hand_worked_rows()
    table = _claims(spans, attacks, defenses, ["weak", "strong"], geometry)
    heads = table[table["part"] == ""].set_index("id")
    expected = {
        beyond.SMALLEST_SPAN_KEPT.id: (HOLDS, "min keep 0.2 -> 0.5 (N=2), 0.0 -> 0.5 (N=8)"),
        beyond.COMPLIANCE_RAISED.id: (FAILS, "+0.3 at N=2, -0.1 at N=8"),
        beyond.CATEGORIES_RISE.id: (FAILS, "A rises, B falls: 1 of 2 is not most"),
        beyond.REFUSAL_DROPPED.id: (HOLDS, "refusal 1 -> 0 on every prompt"),
        beyond.WHITELIST_LOWERS.id: (HOLDS, "mean 0.35 -> 0.15 on every prompt"),
        beyond.FAIR_LOWERS.id: (FAILS, "mean 0.35 -> 0.50 on every prompt"),
        beyond.WHITELIST_KEEPS_REFUSAL.id: (HOLDS, "whitelist refusal 1 at r = 0.5, base 0"),
        beyond.STRONGER_REFUSES.id: (HOLDS, "5 -> 9 of 10 paired: Newcombe [+0.07, ...]"),
        beyond.CRITICAL_MOVES.id: (HOLDS, "weak halves at 0.3, strong never"),
        beyond.LAST_RESTORES.id: (HOLDS, "fair StreamingLLM refuses 0 -> 8 of 10 with the sentence last"),
    }
    assert list(heads.index) == [claim.id for claim in beyond.CLAIMS]
    changed = {
        claim: f"expected {want} ({why}), got {heads.loc[claim, 'verdict']}"
        for claim, (want, why) in expected.items()
        if heads.loc[claim, "verdict"] != want
    }
    assert not changed, changed
    statuses = heads["status"].to_dict()
    assert set(statuses.values()) == {OURS}  # the worst-kept span is a claim: it can lose a token (issue 82)
    # a prompt's value is the mean over its attack rows, one per attack: the count said is of attacks
    assert heads.loc[beyond.REFUSAL_DROPPED.id, "ours"].endswith("(mean over the 2 attacks)")
    for claim in (beyond.SMALLEST_SPAN_KEPT, beyond.COMPLIANCE_RAISED):
        parts = table[(table["id"] == claim.id) & (table["part"] != "")]
        assert heads.loc[claim.id, "n"] == 10 and parts["part"].tolist() == ["N=2", "N=8"]
        assert parts["n"].tolist() == [10, 10]
    assert (
        "-0.10" in heads.loc[beyond.COMPLIANCE_RAISED.id, "ours"]
        or "N=8: 0.60 -> 0.50" in (heads.loc[beyond.COMPLIANCE_RAISED.id, "ours"])
    )
    assert heads.loc[beyond.COMPLIANCE_RAISED.id, "why"].startswith("model: ")
    swapped = geometry.assign(place=geometry["place"].map({"middle": "last", "last": "middle"}))
    line = _claims(spans, attacks, defenses, ["weak", "strong"], swapped).set_index("id").loc[beyond.LAST_RESTORES.id]
    assert line["verdict"] == FAILS  # the sentence last refuses less: no gain, and why, from the rows
    assert line["why"] == (
        "model: fair StreamingLLM keeps 0.90 of the operative words in the middle and 0.00 at the end (r = 0.5, 0.6, 0.7)"
    )
    reversed_ = _claims(spans, attacks, defenses, ["strong", "weak"], geometry).set_index("id")
    assert reversed_.loc[[beyond.STRONGER_REFUSES.id, beyond.CRITICAL_MOVES.id], "verdict"].iloc[[0, -1]].tolist() == [
        FAILS,
        FAILS,
    ]
    silent = _claims(spans, attacks, defenses, ["weak", "silent"], geometry)  # no critical ratio without a refusal
    line = silent[silent["part"] == ""].set_index("id").loc[beyond.CRITICAL_MOVES.id]
    assert line["verdict"] == UNTESTABLE and "silent never refused at r = 0 (refusal 0.00)" in line["ours"]
    with pytest.raises(analysis.AnalysisError, match="no compressed H2O rows"):
        _claims(spans, attacks, defenses, ["weak"], geometry, policy="h2o")


def test_span_figure_draws_the_smallest_span_with_each_counts_n():
    """Two spans per prompt kept at 0.2 and 0.8 under the base policy at r = 0.5 (mean 0.5): the figure draws 0.2,
    the smallest span's keep rate its claim reads, and names each count's prompts (broken on purpose: the mean span
    keep rate drawn -> 0.5)."""
    rows = pd.DataFrame(
        [
            {
                "key": 100 * n + k,
                "n_spans": n,
                "span": s,
                "variant": v,
                "ratio": r,
                "keep_rate": keep,
                "compliance": 1.0,
            }
            for n in (2, 3)
            for k in range(4 if n == 2 else 6)
            for v in ("base", "fair")
            for r in (0.0, 0.5)
            for s, keep in (("span1", 1.0 if r == 0 else 0.2), ("span2", 1.0 if r == 0 else 0.8))
        ]
    )
    fig = beyond.span_figure(rows, "t")
    titles = [ax.get_title() for ax in fig.axes]
    assert "2 spans (n = 4 prompts):\nsmallest span keep rate" in titles
    assert "3 spans (n = 6 prompts):\ncompliance (mean over spans)" in titles
    smallest = [ax for ax in fig.axes if ax.get_title().endswith("smallest span keep rate")]
    drawn = {round(float(y), 6) for ax in smallest for line in ax.lines for y in line.get_ydata()}
    assert drawn == {1.0, 0.2}


def test_budget_figure_axis_and_labels_agree_and_each_point_has_its_n():
    """Spans keeping 4 to 26 tokens: the axis's ticks run to the largest bin (30), its label names the bins as drawn
    (no "60 = 60+"), and every point is labelled with the spans in it (broken on purpose: bins clipped at 60 and the
    old label -> the label check failed)."""
    rows = pd.DataFrame(
        [
            {"key": k, "n_spans": n, "variant": v, "ratio": 0.5, "kept_tokens": kept, "compliance": float(kept > 10)}
            for n in (2, 5)
            for v in ("base", "fair")
            for k, kept in enumerate([4, 6, 14, 26] * (1 if n == 2 else 2))
        ]
    )
    fig = beyond.budget_figure(rows, "t")
    assert {ax.get_xlabel() for ax in fig.axes} == {"tokens kept in the span (nearest 10)"}
    for ax in fig.axes:  # bins 0, 10, 30: 1, 2, 1 spans with 2 spans in the prompt, 2, 4, 2 with 5
        assert max(ax.get_xticks()) == 30
        assert sorted(int(text.get_text()) for text in ax.texts) == [1, 1, 2, 2, 2, 4]
