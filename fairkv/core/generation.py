"""Offline compression of the system prompt, then greedy answers on the compressed cache.

Paper, Section 3 (setup): only the system prompt is compressed, once, during prefill; the user query and the generated
tokens are never compressed; decoding is greedy. As in kvpress's pipeline, the prefill runs the base model without
the LM head, and after compression every token keeps its original position (position ids continue from the
uncompressed prefix length; keys are not re-rotated).

One compressed cache serves every query: decoding builds a new cache around it and never modifies it. Many
(cache, query) pairs decode together in one left-padded running batch that waiting pairs join as others finish
(``answer_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from fairkv.core.attention import decoding
from fairkv.core.models import LoadedModel, clock
from fairkv.core.presses import build_press, get_policy
from fairkv.core.progress import note as progress_note
from fairkv.core.prompts import Prompt, PromptError


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


def _stack_caches(caches: list[DynamicCache], length: int) -> DynamicCache:
    """One batched cache of ``caches`` (any batch sizes, at most ``length`` entries), each left-padded to ``length``."""
    stacked = DynamicCache()
    for layer in range(len(caches[0].layers)):
        keys, values = [], []
        for cache in caches:
            k, v = cache.layers[layer].keys, cache.layers[layer].values
            pad = length - k.shape[2]
            keys.append(F.pad(k, (0, 0, pad, 0)) if pad else k)
            values.append(F.pad(v, (0, 0, pad, 0)) if pad else v)
        stacked.update(torch.cat(keys), torch.cat(values), layer)
    return stacked


@dataclass
class _Running:
    """Sequences decoding together: their cache, attention mask over it, next position, next-token logits and the
    index of the item each row answers."""

    cache: DynamicCache
    mask: torch.Tensor  # (rows, cache length): 1 on real entries, 0 on left padding
    positions: torch.Tensor  # (rows, 1): the position of each row's next token
    logits: torch.Tensor  # (rows, vocab)
    items: list[int]

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` and drop the cache columns that are padding for every remaining row."""
        keep = torch.tensor(rows, device=self.mask.device)
        self.cache.batch_select_indices(keep)
        self.mask, self.positions, self.logits = self.mask[keep], self.positions[keep], self.logits[keep]
        self.items = [self.items[row] for row in rows]
        first = int(self.mask.any(dim=0).int().argmax())
        if first:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def join(self, other: "_Running") -> None:
        """Add ``other``'s rows (both left-padded to the longer cache)."""
        length = max(self.mask.shape[1], other.mask.shape[1])
        self.cache = _stack_caches([self.cache, other.cache], length)
        self.mask = torch.cat([F.pad(m, (length - m.shape[1], 0)) for m in (self.mask, other.mask)])
        self.positions = torch.cat([self.positions, other.positions])
        self.logits = torch.cat([self.logits, other.logits])
        self.items += other.items


def _start(lm: LoadedModel, items: list[tuple[Compressed, torch.Tensor]], indices: list[int], pad_id: int) -> _Running:
    """Run the queries of ``items[indices]`` over their left-padded caches: the first token's logits of each."""
    device = lm.device
    chosen = [items[i] for i in indices]
    cache_len = max(c.cache.get_seq_length() for c, _ in chosen)
    q_len = max(q.shape[1] for _, q in chosen)
    cache = _stack_caches([c.cache for c, _ in chosen], cache_len)
    input_ids = torch.full((len(chosen), q_len), pad_id, dtype=torch.long)
    mask = torch.zeros(len(chosen), cache_len + q_len, dtype=torch.long)
    positions = torch.zeros(len(chosen), q_len, dtype=torch.long)
    for row, (compressed, query) in enumerate(chosen):
        q = query.shape[1]
        input_ids[row, q_len - q :] = query[0]
        mask[row, cache_len - compressed.cache.get_seq_length() : cache_len] = 1
        mask[row, cache_len + q_len - q :] = 1
        positions[row, q_len - q :] = torch.arange(compressed.n_prefix, compressed.n_prefix + q)
    mask, positions = mask.to(device), positions.to(device)
    logits = lm.model(
        input_ids=input_ids.to(device),
        past_key_values=cache,
        attention_mask=mask,
        position_ids=positions,
        logits_to_keep=1,
    ).logits[:, -1]
    return _Running(cache, mask, positions[:, -1:] + 1, logits, list(indices))


@torch.inference_mode()
def answer_batch(
    lm: LoadedModel,
    items: list[tuple[Compressed, torch.Tensor]],
    max_new_tokens: int | list[int],
    stop_at_eos: bool = True,
    batch_size: int | None = None,
    masked: bool = False,
) -> list[Answer]:
    """Greedy answers to many (compressed cache, query ids (1, q)) pairs, decoded in one running batch.

    Caches of different lengths and queries are left-padded and masked; every sequence keeps its original positions
    (its uncompressed prefix length, then onwards) and stops at its own end-of-turn token or its own token budget
    (``max_new_tokens``: one for all, or one per item), leaving the batch. At most ``batch_size`` sequences (None:
    all) decode at once; when a quarter of the places are free, waiting items join the running batch (their queries
    run over their caches, then both are left-padded to one length), so the batch stays full until the work runs out.
    Items wait longest query first, so the queries that run together need little padding.
    The compressed caches are not modified, so one cache serves any number of queries. With one item this is
    kvpress's pipeline decode (``generate_answer``). Attention runs as ``attention.grouped_attention`` (eager's
    operations without copying the cache per query head). ``stop_at_eos=False`` decodes exactly the budget per sequence
    (fixed-length timing, ``benchmarks/``). ``masked``: the caches mark keys evicted per head
    (``attention.head_masked_attention``, ``fairkv.core.per_setting``).
    """
    budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(items)
    if len(budgets) != len(items) or min(budgets, default=1) < 1:
        raise ValueError(f"need one token budget >= 1 per item: {len(items)} items, budgets {budgets[:8]}")
    device, stops = lm.device, stop_token_ids(lm)
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else min(stops)
    capacity = batch_size or len(items)
    start = clock(device)
    waiting = sorted(range(len(items)), key=lambda i: -items[i][1].shape[1])  # similar query lengths join together
    generated: list[list[int]] = [[] for _ in items]
    with decoding(lm.model, masked):
        _decode(lm, items, budgets, capacity, waiting, generated, pad_id, stops, stop_at_eos)
    seconds = (clock(device) - start) / len(items)
    return [
        Answer(text=lm.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids, seconds=seconds)
        for ids in generated
    ]


def _decode(lm, items, budgets, capacity, waiting, generated, pad_id, stops, stop_at_eos) -> None:
    """The running batch of ``answer_batch``: appends each item's tokens to ``generated``."""
    running: _Running | None = None
    produced = 0
    while waiting or running is not None:
        free = capacity - (len(running.items) if running else 0)
        if waiting and free >= max(1, capacity // 4) or running is None:
            joining, waiting = waiting[:free], waiting[free:]
            new = _start(lm, items, joining, pad_id)
            if running is None:
                running = new
            else:
                running.join(new)
        progress_note(
            f"decoding {len(running.items)} answers at once, {len(items) - len(waiting) - len(running.items)} "
            f"of {len(items)} finished, {produced} tokens so far"
        )
        produced += len(running.items)
        tokens = running.logits.argmax(dim=-1)
        going = []  # rows whose sequence goes on
        for row, (item, token) in enumerate(zip(running.items, tokens.tolist())):
            generated[item].append(token)
            if len(generated[item]) < budgets[item] and (token not in stops or not stop_at_eos):
                going.append(row)
        if len(going) < len(running.items):  # finished sequences leave the batch
            if not going:
                running = None
                continue
            running.keep(going)
            tokens = tokens[going]
        running.mask = torch.cat([running.mask, running.mask.new_ones(len(running.items), 1)], dim=1)
        running.logits = lm.model(
            input_ids=tokens.unsqueeze(1),
            past_key_values=running.cache,
            attention_mask=running.mask,
            position_ids=running.positions,
        ).logits[:, -1]
        running.positions = running.positions + 1


def answer(
    lm: LoadedModel, compressed: Compressed, query_ids: torch.Tensor, max_new_tokens: int, stop_at_eos: bool = True
) -> Answer:
    """Greedy answer to one query on the compressed cache (batch size 1, as kvpress's pipeline)."""
    return answer_batch(lm, [(compressed, query_ids)], max_new_tokens, stop_at_eos)[0]
