"""Offline compression of the system prompt, then greedy answers on the compressed cache.

Paper, Section 3 (setup): only the system prompt is compressed, once, during prefill; the user query and the generated
tokens are never compressed; decoding is greedy. As in kvpress's pipeline, the prefill runs the base model without
the LM head, and after compression every token keeps its original position (position ids continue from the
uncompressed prefix length; keys are not re-rotated).

One compressed cache serves every query: each answer decodes on its own copy of it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from fairkv.models import LoadedModel
from fairkv.presses import build_press, get_policy
from fairkv.prompts import Prompt, PromptError


@dataclass
class Compressed:
    """A compressed prefix cache with the kept positions (layer -> (1, kv_heads, n_kept)) and its cost."""

    cache: DynamicCache
    n_prefix: int
    kept: dict[int, torch.Tensor]
    seconds: float
    policy: str | None
    ratio: float
    variant: str = "base"
    lam: float = 1.0


@dataclass
class Answer:
    text: str
    token_ids: list[int] = field(repr=False)
    seconds: float

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def stop_token_ids(lm: LoadedModel) -> set[int]:
    """End-of-turn ids: the generation config's EOS (kvpress's stop rule) plus the tokenizer's EOS."""
    eos = lm.model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if lm.tokenizer.eos_token_id is not None:
        ids.add(lm.tokenizer.eos_token_id)
    return ids


@torch.inference_mode()
def compress(
    lm: LoadedModel,
    prompt: Prompt,
    policy: str | None,
    ratio: float = 0.0,
    variant: str = "base",
    lam: float = 1.0,
    keep_only_whitelist: bool = False,
) -> Compressed:
    """Prefill the prompt's prefix under ``policy`` at ``ratio`` (None: no press) and return the cache.

    ``variant`` (base, whitelist, fair, fair+whitelist) and ``lam`` select the mitigation (``presses.build_press``);
    the prompt supplies the spans and the whitelist positions.
    """
    cache = DynamicCache()
    n = prompt.n_tokens
    start = time.perf_counter()
    if policy is None:
        lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
        kept = {}
    else:
        spec = get_policy(policy)
        if n <= spec.min_tokens:
            raise PromptError(f"policy {policy!r} needs a prefix longer than {spec.min_tokens} tokens; this one has {n}")
        if spec.needs_eager and lm.model.config._attn_implementation != "eager":
            raise PromptError(f"policy {policy!r} needs eager attention: load the model with attn_implementation='eager'")
        press = build_press(
            policy, ratio, variant, [(s.start, s.end) for s in prompt.spans], prompt.protected, lam, keep_only_whitelist
        )
        with press(lm.model):
            lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
        kept = press.kept
    return Compressed(cache, n, kept, time.perf_counter() - start, policy, ratio, variant, lam)


@torch.inference_mode()
def answer(lm: LoadedModel, compressed: Compressed, query_ids: torch.Tensor, max_new_tokens: int) -> Answer:
    """Greedy answer to one query on a copy of the compressed cache, stopping at an end-of-turn token."""
    cache = copy.deepcopy(compressed.cache)
    stops = stop_token_ids(lm)
    n = compressed.n_prefix
    start = time.perf_counter()
    query_ids = query_ids.to(lm.device)
    positions = torch.arange(n, n + query_ids.shape[1], device=lm.device).unsqueeze(0)
    logits = lm.model(input_ids=query_ids, past_key_values=cache, position_ids=positions, logits_to_keep=1).logits
    next_position = n + query_ids.shape[1]
    generated: list[int] = []
    for step in range(max_new_tokens):
        token = int(logits[0, -1].argmax())
        generated.append(token)
        if token in stops or step == max_new_tokens - 1:
            break
        position = torch.tensor([[next_position + step]], device=lm.device)
        logits = lm.model(
            input_ids=torch.tensor([[token]], device=lm.device), past_key_values=cache, position_ids=position
        ).logits
    text = lm.tokenizer.decode(generated, skip_special_tokens=True)
    return Answer(text=text, token_ids=generated, seconds=time.perf_counter() - start)
