"""Offline compression of the system prompt, then greedy answers on the compressed cache.

Paper, Section 3 (setup): only the system prompt is compressed, once, during prefill; the user query and the generated
tokens are never compressed; decoding is greedy. As in kvpress's pipeline, the prefill runs the base model without
the LM head, and after compression every token keeps its original position (position ids continue from the
uncompressed prefix length; keys are not re-rotated).

One compressed cache serves every query: decoding builds a new cache around it and never modifies it. Many
(cache, query) pairs decode together in one left-padded batch (``answer_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from fairkv.models import LoadedModel, clock
from fairkv.presses import build_press, get_policy
from fairkv.progress import note as progress_note
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


def check_policy_fits(lm: LoadedModel, prompt: Prompt, policy: str) -> None:
    """A clear error when the prompt is too short for the policy or the model lacks the attention it needs."""
    spec = get_policy(policy)
    if prompt.n_tokens <= spec.min_tokens:
        raise PromptError(
            f"policy {policy!r} needs a prefix longer than {spec.min_tokens} tokens; this one has {prompt.n_tokens}"
        )
    if spec.needs_eager and lm.model.config._attn_implementation != "eager":
        raise PromptError(f"policy {policy!r} needs eager attention: load the model with attn_implementation='eager'")


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
    start = clock(lm.device)
    if policy is None:
        lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
        kept = {}
    else:
        check_policy_fits(lm, prompt, policy)
        press = build_press(
            policy, ratio, variant, [(s.start, s.end) for s in prompt.spans], prompt.protected, lam, keep_only_whitelist
        )
        with press(lm.model):
            lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
        kept = press.kept
    return Compressed(cache, n, kept, clock(lm.device) - start, policy, ratio, variant, lam)


def _batch_cache(caches: list[DynamicCache], length: int) -> tuple[DynamicCache, torch.Tensor]:
    """Left-pad every cache to ``length`` entries and stack them: (batched cache, (batch, length) mask of real entries)."""
    batched = DynamicCache()
    mask = torch.zeros(len(caches), length, dtype=torch.long)
    for i, cache in enumerate(caches):
        mask[i, length - cache.get_seq_length() :] = 1
    for layer in range(len(caches[0].layers)):
        keys, values = [], []
        for cache in caches:
            k, v = cache.layers[layer].keys, cache.layers[layer].values
            pad = length - k.shape[2]
            keys.append(F.pad(k, (0, 0, pad, 0)) if pad else k)
            values.append(F.pad(v, (0, 0, pad, 0)) if pad else v)
        batched.update(torch.cat(keys), torch.cat(values), layer)
    return batched, mask


@torch.inference_mode()
def answer_batch(
    lm: LoadedModel, items: list[tuple[Compressed, torch.Tensor]], max_new_tokens: int, stop_at_eos: bool = True
) -> list[Answer]:
    """Greedy answers to many (compressed cache, query ids (1, q)) pairs decoded together.

    Caches of different lengths are left-padded and masked; queries are left-padded and masked; every sequence keeps
    its original positions (its uncompressed prefix length, then onwards) and stops at its own end-of-turn token,
    leaving the batch (later steps cost only the sequences still running).
    The compressed caches are not modified, so one cache serves any number of queries. With one item this is
    kvpress's pipeline decode (``generate_answer``). ``stop_at_eos=False`` decodes exactly ``max_new_tokens`` per
    sequence (fixed-length timing, ``benchmarks/``).
    """
    device, stops = lm.device, stop_token_ids(lm)
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else min(stops)
    start = clock(device)
    cache_len = max(c.cache.get_seq_length() for c, _ in items)
    q_len = max(q.shape[1] for _, q in items)
    cache, cache_mask = _batch_cache([c.cache for c, _ in items], cache_len)
    input_ids = torch.full((len(items), q_len), pad_id, dtype=torch.long)
    query_mask = torch.zeros(len(items), q_len, dtype=torch.long)
    positions = torch.zeros(len(items), q_len, dtype=torch.long)
    for i, (compressed, query) in enumerate(items):
        q = query.shape[1]
        input_ids[i, q_len - q :] = query[0]
        query_mask[i, q_len - q :] = 1
        positions[i, q_len - q :] = torch.arange(compressed.n_prefix, compressed.n_prefix + q)
    mask = torch.cat([cache_mask, query_mask], dim=1).to(device)
    logits = lm.model(
        input_ids=input_ids.to(device), past_key_values=cache, attention_mask=mask,
        position_ids=positions.to(device), logits_to_keep=1,
    ).logits
    positions = positions[:, -1:].to(device) + 1  # (batch, 1): each sequence's first generated position
    generated: list[list[int]] = [[] for _ in items]
    active = list(range(len(items)))  # original index of each row still in the batch
    for step in range(max_new_tokens):
        progress_note(f"decoding {len(active)} of {len(items)} answers, token {step + 1} of at most {max_new_tokens}")
        tokens = logits[:, -1].argmax(dim=-1)
        running = []  # rows (of the current batch) whose sequence goes on
        for row, token in enumerate(tokens.tolist()):
            generated[active[row]].append(token)
            if token not in stops or not stop_at_eos:
                running.append(row)
        if not running or step == max_new_tokens - 1:
            break
        if len(running) < len(active):  # finished sequences leave the batch: later steps cost only the rest
            keep = torch.tensor(running, device=device)
            cache.batch_select_indices(keep)
            mask, positions, tokens = mask[keep], positions[keep], tokens[keep]
            active = [active[row] for row in running]
        mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
        logits = lm.model(
            input_ids=tokens.unsqueeze(1), past_key_values=cache, attention_mask=mask, position_ids=positions + step
        ).logits
    seconds = (clock(device) - start) / len(items)
    return [
        Answer(text=lm.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids, seconds=seconds)
        for ids in generated
    ]


def answer(
    lm: LoadedModel, compressed: Compressed, query_ids: torch.Tensor, max_new_tokens: int, stop_at_eos: bool = True
) -> Answer:
    """Greedy answer to one query on the compressed cache (batch size 1, as kvpress's pipeline)."""
    return answer_batch(lm, [(compressed, query_ids)], max_new_tokens, stop_at_eos)[0]
