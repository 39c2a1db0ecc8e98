"""The five policies as kvpress presses: exact budgets, exact reproduction of kvpress, and the Fig 7 mechanism."""

from __future__ import annotations

import pytest
import torch
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

from fairkv.core import generation, prompts
from fairkv.core.presses import PAPER, PolicyError, RecordingPress, Setting, make_press, rates
from fairkv.core.prompts import PromptError

RATIOS = [0.25, 0.5, 0.75]


def prefill(lm, prompt, press):
    cache = DynamicCache()
    with torch.inference_mode(), press(lm.model):
        lm.model.model(input_ids=prompt.ids, past_key_values=cache)
    return cache


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("policy", list(PAPER))
def test_recording_press_matches_kvpress(smollm, normal_prompt, policy, ratio):
    """Kept count per layer and head is compute_n_kept(n, r), and the cache equals the bare kvpress press's."""
    n = normal_prompt.n_tokens
    recorder = RecordingPress(make_press(policy, ratio))
    ours = prefill(smollm, normal_prompt, recorder)
    reference = prefill(smollm, normal_prompt, make_press(policy, ratio))
    n_kept = compute_n_kept(n, ratio)
    assert len(recorder.kept) == smollm.model.config.num_hidden_layers
    for layer, kept in recorder.kept.items():
        assert kept.shape == (1, smollm.model.config.num_key_value_heads, n_kept)
        assert all(len(set(head.tolist())) == n_kept for head in kept[0])  # distinct positions
        assert torch.equal(ours.layers[layer].keys, reference.layers[layer].keys)
        assert torch.equal(ours.layers[layer].values, reference.layers[layer].values)


@pytest.mark.parametrize("policy", list(PAPER))
def test_ratio_zero_keeps_everything_and_answers_like_no_press(smollm, records, normal_prompt, policy):
    plain = generation.compress(smollm, normal_prompt, Setting(None))
    pressed = generation.compress(smollm, normal_prompt, Setting(policy, ratio=0.0))
    kept = rates.keep_rates(pressed.kept, normal_prompt.spans, normal_prompt.n_tokens)
    assert kept == {"defense": 1.0, "directive": 1.0}
    query = normal_prompt.query_ids(records[0].user)
    assert generation.answer(smollm, pressed, query, 12).text == generation.answer(smollm, plain, query, 12).text


def test_uncompressed_answer_equals_transformers_generate(smollm, records, normal_prompt):
    """Our decode loop (separate prefill, explicit positions) gives what transformers' greedy generate gives."""
    query = normal_prompt.query_ids(records[0].user)
    ours = generation.answer(smollm, generation.compress(smollm, normal_prompt, Setting(None)), query, 16)
    ids = torch.cat([normal_prompt.ids, query], dim=1)
    with torch.inference_mode():
        out = smollm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    assert ours.token_ids == out[0, ids.shape[1] :].tolist()


def test_streamingllm_evicts_the_earlier_span(smollm, records, templates):
    """Fig 7: at r = 0.5 StreamingLLM keeps more of the later span; flipping the order flips the bias."""
    for record in records[:5]:
        kept = {}
        for order in ("normal", "flipped"):
            prompt = prompts.paper_prompt(smollm.tokenizer, record, templates, order=order)
            compressed = generation.compress(smollm, prompt, Setting("streamingllm", ratio=0.5))
            kept[order] = rates.keep_rates(compressed.kept, prompt.spans, prompt.n_tokens)
        assert kept["normal"]["directive"] > kept["normal"]["defense"]
        assert kept["flipped"]["defense"] > kept["flipped"]["directive"]


def test_policy_errors(smollm):
    with pytest.raises(PolicyError, match="unknown policy 'h3o'"):
        make_press("h3o", 0.5)
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(PolicyError, match=r"outside \[0, 1\)"):
            make_press("tova", bad)
    short = prompts.build_prompt(smollm.tokenizer, [("only", "Hi.")])
    with pytest.raises(PromptError, match="snapkv.*longer than 16"):
        generation.compress(smollm, short, Setting("snapkv", ratio=0.5))
