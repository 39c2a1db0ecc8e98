"""Score once, cut many: the same kept sets and caches as running the press; batched decoding as batch size 1."""

from __future__ import annotations

import pytest
import torch

from fairkv.core import attention, generation, running, score_once
from fairkv.core.one_prompt import evaluate_prompt
from fairkv.core.presses import PAPER, Setting, WhitelistError

# every variant and lambda of test_mitigations.py's variant matrix, which reads its kept sets from the engine
SETTINGS = [("base", 1.0), ("whitelist", 1.0), ("fair", 1.0), ("fair", 0.5), ("fair", 0.0), ("fair+whitelist", 1.0)]


@pytest.fixture(scope="module")
def prefilled(smollm, normal_prompt):
    return score_once.prefill(smollm, normal_prompt, PAPER)


@pytest.mark.parametrize("policy", list(PAPER))
def test_cut_equals_running_the_press(smollm, normal_prompt, prefilled, policy):
    for ratio in (0.1, 0.3, 0.5, 0.7):
        for variant, lam in SETTINGS:
            pressed = generation.compress(smollm, normal_prompt, Setting(policy, ratio=ratio, variant=variant, lam=lam))
            cut = score_once.cut(prefilled, Setting(policy, ratio=ratio, variant=variant, lam=lam))
            for layer, indices in pressed.kept.items():
                assert torch.equal(cut.kept[layer], indices), (policy, ratio, variant, lam, layer)
                # same gather order: the caches are identical, not just the sets
                assert torch.equal(cut.cache.layers[layer].keys, pressed.cache.layers[layer].keys)


def test_cut_at_ratio_zero_and_without_policy(normal_prompt, prefilled):
    full = score_once.cut(prefilled, Setting(None, ratio=0.0))
    assert full.cache.get_seq_length() == normal_prompt.n_tokens and full.kept == {}
    assert score_once.cut(prefilled, Setting("tova", ratio=0.0)).cache.get_seq_length() == normal_prompt.n_tokens


def test_cut_needs_a_whitelist_phrase(smollm):
    from fairkv.core import prompts

    prompt = prompts.build_prompt(
        smollm.tokenizer, [("a", "Answer every question in exactly two short sentences, please.")]
    )
    with pytest.raises(WhitelistError, match="phrase was not found"):
        score_once.cut(score_once.prefill(smollm, prompt, ("knorm",)), Setting("knorm", ratio=0.5, variant="whitelist"))


def test_batched_decoding_matches_batch_one(smollm, records, normal_prompt, prefilled, attack, monkeypatch):
    """Caches of different lengths and queries of different lengths, decoded together, as one by one."""
    items = []
    for policy, ratio in [(None, 0.0), ("streamingllm", 0.5), ("snapkv", 0.3), ("knorm", 0.7), ("tova", 0.5)]:
        compressed = score_once.cut(prefilled, Setting(policy, ratio=ratio))
        for query in (records[0].user, attack):
            items.append((compressed, normal_prompt.query_ids(query)))
    batched = generation.answer_batch(smollm, items, 24)
    single = [generation.answer(smollm, c, q, 24) for c, q in items]
    assert [b.token_ids for b in batched] == [s.token_ids for s in single], [
        (b.text, s.text) for b, s in zip(batched, single) if b.token_ids != s.token_ids
    ]
    # the compressed caches are untouched by decoding: decoding again gives the same answers
    assert [a.token_ids for a in generation.answer_batch(smollm, items, 24)] == [b.token_ids for b in batched]
    # a running batch of 4 that waiting items join as others finish, each with its own budget: the same answers,
    # cut at each budget
    budgets = [24, 5, 17, 24, 9, 24, 1, 12, 24, 3]
    joined = generation.answer_batch(smollm, items, budgets, batch_size=4)
    assert [a.token_ids for a in joined] == [s.token_ids[:k] for s, k in zip(single, budgets)]
    # the running batch's buffers laid out anew every few steps and at joins (``running.ROOM``): the same answers
    monkeypatch.setattr(running, "ROOM", 2)
    joined = generation.answer_batch(smollm, items, budgets, batch_size=4)
    assert [a.token_ids for a in joined] == [s.token_ids[:k] for s, k in zip(single, budgets)]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_grouped_attention_is_eager_attention(dtype, tolerance):
    """Decoding's kernel against transformers' eager attention on random tensors (12 query heads over 2 KV heads, a
    padded mask), called as kvpress's wrapper of registered attention functions calls it (dropout sixth)."""
    from kvpress.attention_patch import attention_patch
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = 6, False
    query = torch.randn(3, 12, 2, 16, dtype=dtype)
    key, value = torch.randn(3, 2, 9, 16, dtype=dtype), torch.randn(3, 2, 9, 16, dtype=dtype)
    mask = torch.zeros(3, 1, 2, 9, dtype=dtype)
    mask[0, :, :, :4] = torch.finfo(dtype).min  # left padding of the first sequence
    expected, _ = eager_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, weights = attention_patch(attention.grouped_attention)(module, query, key, value, mask, 0.0, scaling=0.25)
    assert weights is None and got.shape == expected.shape == (3, 2, 12, 16)
    assert torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_evaluate_prompt_answers_each_cell_as_alone(smollm, records, normal_prompt, prefilled, attack):
    """The quickstart's evaluation decodes every cell in one batch: each row holds its own cell's two answers, the
    r = 0 row is shared by every policy."""
    record = records[0]
    evaluation = evaluate_prompt(
        smollm, record, normal_prompt, attack, ["streamingllm", "knorm"], [0.0, 0.5], 16, False
    )
    assert len(evaluation.rows) == 4
    for row in evaluation.rows.itertuples():
        cut = score_once.cut(prefilled, Setting(row.policy if row.ratio else None, ratio=row.ratio))
        benign, attacked = (
            generation.answer(smollm, cut, normal_prompt.query_ids(q), 16) for q in (record.user, attack)
        )
        assert (row.benign_response, row.attack_response) == (benign.text, attacked.text), (row.policy, row.ratio)
    assert evaluation.rows.groupby("ratio")["attack_response"].nunique().to_dict() == {0.0: 1, 0.5: 2}
