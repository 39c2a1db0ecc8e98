"""The press atlas (notebook 12): every kvpress press catalogued, kept sets read from kvpress's own compress, the
one-prefill collector equal to running each press alone, resumable rows, and the bias verdicts."""

import pandas as pd
import pytest
import torch
from hand_rows import answer
from kvpress import BasePress

from fairkv import studies
from fairkv.core import data, prompts, score_once
from fairkv.core.presses import PAPER, PolicyError, Setting, kept, rates, registry
from fairkv.report import press_patterns, verdicts
from fairkv.report.claims import OURS, SANITY
from fairkv.report.verdicts import HOLDS, INCONCLUSIVE, UNTESTABLE
from fairkv.runs import atlas
from fairkv.runs.atlas import AtlasError
from fairkv.runs.store import StoreError
from fairkv.studies import atlas as atlas_study
from fairkv.studies import mechanism


def test_the_registry_names_every_kvpress_press_with_how_or_why_not():
    """Every press kvpress exports is one policy (one entry, its class) or not run with a reason, never both; a policy
    of a class kvpress does not export (a press of fairkv's own in the catalogue) is a kvpress press all the same
    (broken on purpose: a declaration of a class no press at all)."""
    policies = [p.name for p in registry.REGISTRY.values()]
    assert len(policies) == len(set(policies)) and not set(policies) & set(registry.NOT_RUN)
    assert set(registry.kvpress_presses()) <= set(policies) | set(registry.NOT_RUN)
    assert set(registry.NOT_RUN) <= set(registry.kvpress_presses())
    assert all(issubclass(p.cls, BasePress) for p in registry.REGISTRY.values())
    assert all(registry.NOT_RUN.values())
    for policy in registry.REGISTRY.values():
        assert policy.scoring in ("independent", "cross-token", "wrapper of SnapKV"), policy.name
        assert isinstance(policy.build(0.5), policy.cls), policy.name
    assert len(registry.runnable()) >= 20
    assert [registry.REGISTRY[k].label for k in PAPER] == ["StreamingLLM", "H2O", "SnapKV", "TOVA", "K-Norm"]
    assert set(atlas.skipped()["press"]) == set(registry.NOT_RUN)


def test_runnable_names_the_reason_for_a_press_it_cannot_run():
    assert [e.label for e in registry.runnable(["KeyDiffPress", "SnapKV"])] == ["KeyDiff", "SnapKV"]
    with pytest.raises(PolicyError, match="Hugging Face hub"):
        registry.runnable(["QFilterPress"])
    with pytest.raises(PolicyError, match="unknown press 'Nope'"):
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
    with pytest.raises(PolicyError, match="not copies"):
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
            assert together[(entry.label, ratio)] == (rates.span_rates(alone.masks, normal_prompt.spans), None), (
                entry.label,
                ratio,
            )
    differs = {e.label for e in entries if together[(e.label, 0.7)] != together[("SnapKV", 0.7)]}
    assert len(differs) >= len(entries) - 3  # the presses are not one press under many names


def test_the_paper_presses_keep_what_the_engine_keeps(smollm, normal_prompt):
    entries = [e for e in registry.runnable() if e.paper]
    atlas_rates = atlas.keep_rates(smollm, normal_prompt, entries, (0.5,))
    policies = ("streamingllm", "h2o", "snapkv", "tova", "knorm")  # the catalog's order
    assert [entry.key for entry in entries] == list(policies)  # each paper press met by its own policy
    prefilled = score_once.prefill(smollm, normal_prompt, policies)
    for entry, policy in zip(entries, policies):
        cut = score_once.cut(prefilled, Setting(policy, ratio=0.5))
        expected = rates.keep_rates(cut.kept, normal_prompt.spans, normal_prompt.n_tokens)
        assert atlas_rates[(entry.label, 0.5)][0] == pytest.approx(expected, abs=1e-6), entry.label


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


def test_a_bias_within_the_balance_margin_is_no_side():
    """A press whose bias lies above 0 in both orders, but within +-BALANCED_WITHIN in both (Random's +0.002
    [+0.0007, +0.004] on the committed rows), is balanced, not "directive lost first in both orders"; one beyond the
    margin in one order is inconclusive (broken on purpose: the sign read against 0 alone -> the first was the
    directive's)."""
    slight = {
        ("slight", "normal"): [0.003 + 0.001 * (-1) ** k for k in range(N)],
        ("slight", "flipped"): [0.01 + 0.001 * (-1) ** k for k in range(N)],
        ("half", "normal"): [0.003 + 0.001 * (-1) ** k for k in range(N)],
        ("half", "flipped"): [0.1 + 0.001 * (-1) ** k for k in range(N)],
    }
    patterns = press_patterns.pattern(press_patterns.bias(_frame(slight))).set_index("press")["pattern"]
    assert patterns.to_dict() == {"slight": press_patterns.BALANCED, "half": "inconclusive"}
    # an interval ending at the margin itself is within it, for the sign and for balanced alike
    edge = pd.DataFrame(
        [
            {"press": "edge", "order": o, "bias": 0.019, "low": 0.018, "high": 0.02, "n": 20}
            for o in ("normal", "flipped")
        ]
    )
    assert press_patterns.pattern(edge)["pattern"].tolist() == [press_patterns.BALANCED]


STATED = {"late": "StreamingLLM", "early": "TOVA", "noisy": "K-Norm"}  # made-up presses under the stated presses' names


def _named() -> pd.DataFrame:
    """The made-up presses, three under the names of the presses whose pattern the paper states (the paper's), and a
    copy of StreamingLLM's rows under LagKV's name."""
    rows = _frame(BIASES).assign(press=lambda t: t["press"].replace(STATED))
    rows["paper"] = rows["press"].isin(STATED.values())
    copy = rows[rows["press"] == "StreamingLLM"].assign(press="LagKV", paper=False)
    return pd.concat([rows, copy], ignore_index=True)


def _attacked(refusals: dict[str, dict[tuple[str, float], list[int]]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"policy": policy, "variant": v, "order": "normal", "ratio": r, "key": k, "refused": float(x), **answer(x)}
            for policy, settings in refusals.items()
            for (v, r), values in settings.items()
            for k, x in enumerate(values)
        ]
    )


LOSES = {("base", 0.0): [1] * N, ("base", 0.5): [0] * 18 + [1] * 2, ("whitelist", 0.5): [1] * 19 + [0]}
KEEPS = {("base", 0.0): [1] * N, ("base", 0.5): [1] * N, ("whitelist", 0.5): [1] * N}


def test_a_press_identical_to_another_is_named_and_not_ranked():
    """LagKV's rows are StreamingLLM's: the patterns table names it "identical to StreamingLLM", and it takes no place
    among the most biased, whose ranking it would otherwise lead (broken on purpose: the copies not left out of the
    ranking -> LagKV first)."""
    rows = _named()
    same = press_patterns.identical(rows)
    assert same == {"LagKV": "StreamingLLM"}
    table = press_patterns.bias(rows)
    patterns = press_patterns.pattern(table, same).set_index("press")["pattern"]
    assert patterns["LagKV"] == "identical to StreamingLLM" and patterns["StreamingLLM"] == press_patterns.LATER
    candidates = ["LagKV", "defense", "even"]
    assert press_patterns.most_biased(table, candidates, n=2) == ["LagKV", "defense"]
    assert press_patterns.most_biased(table, candidates, n=2, identical=same) == ["defense", "even"]
    moved = rows.copy()
    moved.loc[(moved["press"] == "LagKV") & (moved["key"] == 3), "keep_defense"] += 0.01  # one token of one prompt
    assert press_patterns.identical(moved) == {}


def test_the_atlas_claims_hand_worked(monkeypatch):
    """The stated pattern: StreamingLLM keeps the later span (a sanity check: holds); K-Norm's and TOVA's are notebook
    04's claims, not counted again here (issue 82), and no other press gets one. LagKV keeps exactly what StreamingLLM
    keeps on these prompts (a claim of ours: holds). The attack side: SnapKV loses the refusal
    (1.0 -> 0.1) and the whitelist restores it (0.95); KeyDiff keeps it on 20 prompts (1.0 -> 1.0): a loss neither
    shown nor excluded (Newcombe +-0.16), so its restoration stays a part, undecided: the claim reads inconclusive.
    Refusing every attack of 100 prompts at r = 0.5 (Wilson [0.96, 1]), KeyDiff leaves nothing to restore: alone, the
    claim is untestable here, named with its numbers. LagKV's attack rows, a copy's, are not counted (broken on
    purpose: an undecided loss dropped from the parts -> the claim read holds)."""
    monkeypatch.setattr(studies, "family", lambda: 10)
    rows = _named()
    attacked = _attacked({"snapkv": LOSES, "keydiff": KEEPS, "lagkv": LOSES})
    table = studies.paper_vs_us(atlas_study, press_patterns.bias(rows), attacked, rows=rows)
    heads = table[table["part"] == ""].set_index("id")
    assert heads["verdict"].to_dict() == {
        atlas_study.STREAMING_LATER.id: HOLDS,
        atlas_study.LAGKV_IS_STREAMING.id: HOLDS,
        atlas_study.REFUSAL_LOST.id: INCONCLUSIVE,
        atlas_study.WHITELIST_RESTORES.id: INCONCLUSIVE,
    }
    assert heads["status"].to_dict() == {
        atlas_study.STREAMING_LATER.id: SANITY,
        atlas_study.LAGKV_IS_STREAMING.id: OURS,
        atlas_study.REFUSAL_LOST.id: OURS,
        atlas_study.WHITELIST_RESTORES.id: OURS,
    }
    assert set(heads["magnitude"]) == {verdicts.NOT_APPLICABLE} and set(heads["n"]) == {N}
    parts = table[table["part"] != ""]
    assert parts[parts["id"] == atlas_study.REFUSAL_LOST.id]["part"].tolist() == ["SnapKV", "KeyDiff"]
    restores = heads.loc[atlas_study.WHITELIST_RESTORES.id, "ours"]
    assert restores.startswith("whitelist - base SnapKV +0.85") and "KeyDiff +0.00" in restores
    assert "LagKV: identical to StreamingLLM, not counted" in restores
    # on 20 prompts, 0.95 against the uncompressed 1.00 is a rise whose return to within RATE_MARGIN of the
    # uncompressed level is undecided, at least partly restored, and the attack side alone cannot say what the
    # whitelist costs benign queries
    assert heads.loc[atlas_study.WHITELIST_RESTORES.id, "mechanism"] == verdicts.INCONCLUSIVE
    said = f"SnapKV inconclusive ({mechanism.AT_LEAST_PARTLY}, {mechanism.NOT_RUN})"
    assert said in heads.loc[atlas_study.WHITELIST_RESTORES.id, "why"]
    assert "largest keep-rate difference 0.00" in heads.loc[atlas_study.LAGKV_IS_STREAMING.id, "ours"]
    many = {setting: [1] * 100 for setting in KEEPS}
    alone = studies.paper_vs_us(atlas_study, press_patterns.bias(rows), _attacked({"keydiff": many}), rows=rows)
    line = alone[alone["part"] == ""].set_index("id").loc[atlas_study.WHITELIST_RESTORES.id]
    assert line["verdict"] == UNTESTABLE and "KeyDiff shows no loss" in line["why"]
    assert "untestable here: KeyDiff shows no loss" in line["ours"]
    others = _frame({key: value for key, value in BIASES.items() if key[0] in ("defense", "even")})
    assert studies.paper_vs_us(atlas_study, press_patterns.bias(others)).empty  # no press whose pattern is stated


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
