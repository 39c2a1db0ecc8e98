"""The press atlas (notebook 12): every kvpress press catalogued, kept sets read from kvpress's own compress, the
one-prefill collector equal to running each press alone, resumable rows, and the bias verdicts."""

import pandas as pd
import pytest
import torch
from kvpress import BasePress

from fairkv.core import data, metrics, prompts, score_once
from fairkv.core.presses import kept, registry
from fairkv.report import press_patterns
from fairkv.runs import atlas
from fairkv.runs.atlas import AtlasError
from fairkv.runs.store import StoreError


def test_catalog_names_every_kvpress_press_with_how_or_why_not():
    assert set(registry.CATALOG) == set(registry.kvpress_presses())
    for entry in registry.CATALOG.values():
        assert (entry.build is None) == bool(entry.reason), entry.name
        if entry.build is not None:
            assert entry.scoring in ("independent", "cross-token", "wrapper of SnapKV"), entry.name
    assert len(registry.runnable()) >= 20
    assert {e.label for e in registry.runnable() if e.paper} == {"StreamingLLM", "H2O", "SnapKV", "TOVA", "K-Norm"}
    assert set(atlas.skipped()["press"]) == {n for n, e in registry.CATALOG.items() if e.build is None}


def test_runnable_names_the_reason_for_a_press_it_cannot_run():
    assert [e.label for e in registry.runnable(["KeyDiffPress", "SnapKV"])] == ["KeyDiff", "SnapKV"]
    with pytest.raises(registry.PolicyError, match="Hugging Face hub"):
        registry.runnable(["QFilterPress"])
    with pytest.raises(registry.PolicyError, match="unknown press 'Nope'"):
        registry.runnable(["Nope"])


def test_kept_mask_reads_gathered_keys_and_masked_indices():
    keys = torch.randn(1, 2, 6, 4)
    positions = torch.tensor([[[0, 3, 5], [1, 2, 4]]])
    gathered = keys.gather(2, positions.unsqueeze(-1).expand(-1, -1, -1, 4))
    mask = kept.kept_mask(keys, gathered)
    assert mask.tolist() == [[[True, False, False, True, False, True], [False, True, True, False, True, False]]]
    assert kept.kept_mask(keys.bfloat16(), gathered.bfloat16()).equal(mask)
    masked = (torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([2, 5]))
    assert kept.kept_mask(keys, keys, masked)[0, :, 2].tolist() == [False, True]
    assert kept.kept_mask(keys, keys).all()
    with pytest.raises(registry.PolicyError, match="not copies"):
        kept.kept_mask(keys, gathered + 1e-3)


class _Alone(BasePress):
    """One press run the way kvpress runs it, alone in its own prefill, recording its kept positions."""

    def __init__(self, entry, ratio):
        self.entry, self.press, self.masks = entry, entry.build(ratio), []

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        weights = attentions if self.entry.attentions else None
        self.masks.append(kept.press_mask(self.press, module, hidden_states, keys, values, weights, kwargs))
        return keys, values


@torch.inference_mode()
def test_one_prefill_for_every_press_equals_running_each_press(smollm, normal_prompt):
    ratios = (0.3, 0.7)
    entries = registry.runnable()
    together = atlas.keep_rates(smollm, normal_prompt, entries, ratios)
    for entry in entries:
        for ratio in ratios:
            alone = _Alone(entry, ratio)
            with alone(smollm.model):
                smollm.model.model(input_ids=normal_prompt.ids)
            assert together[(entry.label, ratio)] == (atlas.span_rates(alone.masks, normal_prompt.spans), None), (
                entry.label,
                ratio,
            )
    differs = {e.label for e in entries if together[(e.label, 0.7)] != together[("SnapKV", 0.7)]}
    assert len(differs) >= len(entries) - 3  # the presses are not one press under many names


def test_the_paper_presses_keep_what_the_engine_keeps(smollm, normal_prompt):
    entries = [e for e in registry.runnable() if e.paper]
    rates = atlas.keep_rates(smollm, normal_prompt, entries, (0.5,))
    policies = ("streamingllm", "h2o", "snapkv", "tova", "knorm")  # the catalog's order
    prefilled = score_once.prefill(smollm, normal_prompt, policies)
    for entry, policy in zip(entries, policies):
        cut = score_once.cut(prefilled, policy, 0.5)
        expected = metrics.keep_rates(cut.kept, normal_prompt.spans, normal_prompt.n_tokens)
        assert rates[(entry.label, 0.5)][0] == pytest.approx(expected, abs=1e-6), entry.label


def test_run_stores_rows_resumes_and_refuses_other_code(smollm, tmp_path, monkeypatch):
    plan = atlas.Plan("ci", n_prompts=1, ratios=(0.5,), presses=("SnapKV", "KeyDiff"))
    rows = atlas.run(plan, folder=tmp_path, progress=False, lm=smollm)
    assert len(rows) == 4 and set(rows["order"]) == {"normal", "flipped"} and rows["error"].isna().all()
    assert rows["keep_defense"].between(0, 1).all() and (rows["scoring"] == "cross-token").all()
    monkeypatch.setattr(atlas, "keep_rates", lambda *a: pytest.fail("a stored row was recomputed"))
    again = atlas.run(plan, folder=tmp_path, progress=False, lm=smollm)
    assert again["keep"].tolist() == rows["keep"].tolist()
    monkeypatch.setattr(atlas, "versions", lambda: {"atlas": "other"})
    with pytest.raises(StoreError, match="different versions or code"):
        atlas.run(plan, folder=tmp_path, progress=False, lm=smollm)


def _frame(biases: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
    rows = [
        {
            "press": press,
            "order": order,
            "ratio": 0.5,
            "key": k,
            "keep_defense": 0.5 + d / 2,
            "keep_directive": 0.5 - d / 2,
            "scoring": "independent",
            "paper": False,
        }
        for (press, order), values in biases.items()
        for k, d in enumerate(values)
    ]
    return pd.DataFrame(rows)


N = 20
BIASES = {  # per-prompt biases (defense - directive keep rate) of five made-up presses in both orders
    ("late", "normal"): [-0.4 + 0.01 * k for k in range(N)],
    ("late", "flipped"): [0.4 - 0.01 * k for k in range(N)],
    ("early", "normal"): [0.3] * N,
    ("early", "flipped"): [-0.3 + 0.001 * k for k in range(N)],
    ("defense", "normal"): [-0.2] * N,
    ("defense", "flipped"): [-0.25 + 0.001 * k for k in range(N)],
    ("even", "normal"): [0.005 * (-1) ** k for k in range(N)],
    ("even", "flipped"): [0.001 * (-1) ** k for k in range(N)],
    ("noisy", "normal"): [0.5 * (-1) ** k for k in range(N)],
    ("noisy", "flipped"): [0.4 * (-1) ** k for k in range(N)],
}


def test_bias_ranks_presses_and_pattern_reads_both_orders():
    rows = _frame(BIASES)
    table = press_patterns.bias(rows)
    assert list(table[table["order"] == "normal"]["press"]) == ["late", "defense", "even", "noisy", "early"]
    assert table[(table["press"] == "late") & (table["order"] == "normal")]["bias"].iloc[0] == pytest.approx(-0.305)
    patterns = press_patterns.pattern(table).set_index("press")["pattern"]
    assert patterns.to_dict() == {
        "late": press_patterns.LATER,
        "defense": press_patterns.DEFENSE,
        "even": press_patterns.BALANCED,
        "noisy": "inconclusive",
        "early": press_patterns.EARLIER,
    }
    with pytest.raises(AtlasError, match="no atlas rows at r = 0.3"):
        press_patterns.bias(rows, ratio=0.3)
    with pytest.raises(AtlasError, match="needs both orders"):
        press_patterns.pattern(press_patterns.bias(rows[rows["order"] == "normal"]))


def test_the_atlas_judges_a_press_only_against_the_pattern_the_paper_states():
    """Three made-up presses with a stated pattern: "late" stated to favour the later span (it does: holds), "early"
    stated balanced (it favours the earlier span: fails), "noisy" stated to favour the later span (undecided:
    inconclusive); "defense" and "even" have no stated pattern and get no claim (the patterns table describes them).
    The attack side: refusal 1.0 -> 0.1 under compression (lost: holds), whitelist 0.95 (restored: holds)."""
    from fairkv.report import paper

    rows = _frame(BIASES)
    refusals = {("base", 0.0): [1] * N, ("base", 0.5): [0] * 18 + [1] * 2, ("whitelist", 0.5): [1] * 19 + [0]}
    attacked = pd.DataFrame(
        [
            {"policy": "snapkv", "variant": v, "ratio": r, "key": k, "refused": float(x)}
            for (v, r), values in refusals.items()
            for k, x in enumerate(values)
        ]
    )
    stated = {
        "late": (press_patterns.LATER, "later"),
        "early": (press_patterns.BALANCED, "balanced"),
        "noisy": (press_patterns.LATER, "later"),
    }
    claims = paper.press_atlas(press_patterns.bias(rows), attacked, stated=stated).set_index("claim")
    assert claims["verdict"].to_dict() == {
        f"late: {press_patterns.LATER}, both orders (r = 0.5)": "holds",
        "early: balanced, both orders (r = 0.5)": "fails",
        f"noisy: {press_patterns.LATER}, both orders (r = 0.5)": "inconclusive",
        "SnapKV: compression loses the refusal (base, r = 0.5 vs 0)": "holds",
        "SnapKV: the whitelist restores the refusal (r = 0.5)": "holds",
    }
    assert claims.loc["early: balanced, both orders (r = 0.5)", "why"].startswith("model:")
    assert set(claims["magnitude"]) == {"n.a."} and set(claims["figure"]) == {"12_atlas_bias", "12_atlas_attacks"}
    default = paper.press_atlas(
        press_patterns.bias(rows)
    )  # none of the made-up presses is one whose pattern the paper states
    assert default.empty


def test_a_press_that_raises_on_a_prompt_is_recorded_with_its_error(smollm, records, templates):
    """SnapKV inside 64-token chunks cannot score a last chunk shorter than its window: kvpress asserts; the atlas
    keeps the other presses' rates and names the error, and the bias leaves that prompt out."""
    prompt = prompts.paper_prompt(smollm.tokenizer, data.get_record(records, 3362), templates, "normal")
    assert prompt.n_tokens % 64 <= 16  # a last chunk shorter than SnapKV's 16-token window
    rates = atlas.keep_rates(smollm, prompt, registry.runnable(["Chunk64(SnapKV)", "KeyDiff"]), (0.5,))
    assert rates[("KeyDiff", 0.5)][1] is None
    keep, error = rates[("Chunk64(SnapKV)", 0.5)]
    assert error.startswith("AssertionError") and all(v != v for v in keep.values())
    rows = _frame({("a", "normal"): [0.1, 0.2, float("nan")], ("a", "flipped"): [0.1, 0.2, 0.3]})
    rows["error"] = [None, None, "AssertionError: x", None, None, None]
    assert press_patterns.bias(rows).set_index("order")["n"].to_dict() == {"normal": 2, "flipped": 3}
    assert press_patterns.failures(rows).to_dict("records") == [
        {"press": "a", "ratio": 0.5, "failed": 1, "of": 6, "error": "AssertionError: x"}
    ]
