"""Offline compression of the system prompt, then greedy answers on the compressed cache.

Paper, Section 3 (setup): only the system prompt is compressed, once, during prefill; the user query and the generated
tokens are never compressed; decoding is greedy. As in kvpress's pipeline, the prefill runs the base model without
the LM head, and after compression every token keeps its original position (position ids continue from the
uncompressed prefix length; keys are not re-rotated).

One compressed cache serves every query: decoding builds a new cache around it and never modifies it. Many
(cache, query) pairs decode together in one left-padded running batch that waiting pairs join as others finish
(``Decoder``; ``answer_batch`` for a list of pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from fairkv.core.attention import decoding
from fairkv.core.models import LoadedModel, clock
from fairkv.core.presses import Setting, build_press, get_policy
from fairkv.core.progress import note as progress_note
from fairkv.core.prompts import Prompt, PromptError
from fairkv.core.running import Running


@dataclass
class Compressed:
    """A compressed prefix cache with the kept positions (layer -> (1, kv_heads, n_kept)) and its cost."""

    cache: DynamicCache
    n_prefix: int
    kept: dict[int, torch.Tensor]
    seconds: float
    setting: Setting  # policy None: the uncompressed cache


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
def compress(lm: LoadedModel, prompt: Prompt, setting: Setting, keep_only_whitelist: bool = False) -> Compressed:
    """Prefill the prompt's prefix under ``setting`` (policy None: no press) and return the cache.

    The setting's variant (base, whitelist, fair, fair+whitelist) and lam select the mitigation
    (``presses.build_press``); the prompt supplies the spans and the whitelist positions.
    """
    cache = DynamicCache()
    n = prompt.n_tokens
    start = clock(lm.device)
    if setting.policy is None:
        lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
        kept = {}
    else:
        check_policy_fits(lm, prompt, setting.policy)
        press = build_press(setting, prompt.marks, keep_only_whitelist)
        with press(lm.model):
            lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
        kept = press.kept
    return Compressed(cache, n, kept, clock(lm.device) - start, setting)


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


def _prefill_queries(lm: LoadedModel, chosen: list[tuple[Compressed, torch.Tensor]], pad_id: int, masked: bool):
    """Run the queries of ``chosen`` over their left-padded caches: the cache (a ``DynamicCache``), its attention mask,
    the next positions and the first token's logits of each."""
    device = lm.device
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
    with decoding(lm.model, masked):
        logits = lm.model(
            input_ids=input_ids.to(device),
            past_key_values=cache,
            attention_mask=mask,
            position_ids=positions,
            logits_to_keep=1,
        ).logits[:, -1]
    return cache, mask, positions[:, -1:] + 1, logits


def _least_padding(waiting: list, free: int) -> list:
    """The ``free`` waiting items (all if fewer) to join next: the oldest, with those of the most similar query lengths
    around it (the fewest padded query tokens among the runs of ``free`` in order of length that hold it)."""
    if len(waiting) <= free:
        return list(waiting)
    ranked = sorted(range(len(waiting)), key=lambda i: -waiting[i].query.shape[1])
    lengths = [waiting[i].query.shape[1] for i in ranked]
    oldest = ranked.index(0)
    runs = range(max(0, oldest - free + 1), min(oldest, len(ranked) - free) + 1)
    best = min(runs, key=lambda lo: free * lengths[lo] - sum(lengths[lo : lo + free]))
    return [waiting[i] for i in ranked[best : best + free]]


@dataclass(frozen=True)
class Request:
    """A (compressed cache, query ids (1, q)) pair to answer within ``budget`` new tokens; ``key`` (hashable) names it."""

    key: object
    compressed: Compressed
    query: torch.Tensor
    budget: int


class Decoder:
    """Greedy answers decoded in one running batch (``fairkv.core.running``) that requests join as others finish.

    Caches of different lengths and queries are left-padded and masked; every sequence keeps its original positions
    (its uncompressed prefix length, then onwards) and stops at its own end-of-turn token or its own token budget,
    leaving the batch. At most ``batch_size`` sequences decode at once. Whenever ``JOIN_FREE`` of the places are free,
    waiting requests join: their queries run over their caches in one batched prefill, the oldest waiting request
    with those of the most similar query lengths (``_least_padding``). ``add`` requests as they are built (a sweep adds
    each prompt's as its cache is cut), and ``answers`` decodes, yielding each answer as it finishes: with ``drain``
    False it returns as soon as the batch has places that the waiting requests cannot fill with ``LOOKAHEAD`` of the
    batch to spare (add more, then call again), so the batch stays full while there is work; with ``drain`` True it
    answers everything. The compressed caches are not modified, so one cache serves any number of queries.
    ``masked``: the caches mark keys evicted per head (``attention.head_masked_attention``,
    ``fairkv.core.per_setting``). ``stop_at_eos=False`` decodes exactly the budget (fixed-length timing,
    ``benchmarks/``). An answer's ``seconds`` is its share of the batch's wall time: each forward's time split among
    the rows it ran."""

    JOIN_FREE = 1 / 8
    LOOKAHEAD = 1 / 2

    def __init__(self, lm: LoadedModel, batch_size: int, stop_at_eos: bool = True, masked: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        self.lm, self.batch_size, self.stop_at_eos, self.masked = lm, batch_size, stop_at_eos, masked
        self.stops = stop_token_ids(lm)
        tokenizer = lm.tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stops)
        self.waiting: list[Request] = []
        self.running: Running | None = None
        self.requests: dict[object, Request] = {}  # key -> request, while it waits or decodes
        self.generated: dict[object, list[int]] = {}
        self.spent: dict[object, float] = {}
        self.finished = self.produced = 0

    def add(self, request: Request) -> None:
        if request.budget < 1:
            raise ValueError(f"a token budget must be >= 1: {request.key} has {request.budget}")
        if request.key in self.requests:
            raise ValueError(f"request {request.key} was added twice")
        self.requests[request.key] = request
        self.waiting.append(request)
        self.generated[request.key], self.spent[request.key] = [], 0.0

    @torch.inference_mode()
    def answers(self, drain: bool = True) -> Iterator[tuple[object, Answer]]:
        capacity, device = self.batch_size, self.lm.device
        while self.waiting or self.running is not None:
            tick = clock(device)
            free = capacity - (len(self.running.items) if self.running else 0)
            if self.waiting and (self.running is None or free >= max(1, int(capacity * self.JOIN_FREE))):
                if not drain and len(self.waiting) < free + int(capacity * self.LOOKAHEAD):
                    return
                self._join(_least_padding(self.waiting, free), tick)
                tick = clock(device)
            running = self.running
            progress_note(
                f"decoding {len(running.items)} answers at once, {self.finished} finished, {len(self.waiting)} "
                f"waiting, {self.produced} tokens so far"
            )
            self.produced += len(running.items)
            tokens = running.logits.argmax(dim=-1)
            done = []
            for row, (key, token) in enumerate(zip(running.items, tokens.tolist())):
                ids = self.generated[key]
                ids.append(token)
                if len(ids) >= self.requests[key].budget or (self.stop_at_eos and token in self.stops):
                    done.append(row)
            finished = [running.items[row] for row in done]
            if len(done) == len(running.items):
                self.running = None
            else:
                if done:
                    tokens = tokens[running.drop(done)]
                bias = running.step()
                with decoding(self.lm.model, self.masked):
                    running.logits = self.lm.model(
                        input_ids=tokens.unsqueeze(1),
                        past_key_values=running.cache,
                        attention_mask=bias,
                        position_ids=running.positions,
                    ).logits[:, -1]
                running.positions = running.positions + 1
                share = (clock(device) - tick) / len(running.items)
                for key in running.items:
                    self.spent[key] += share
            for key in finished:
                yield key, self._answer(key)

    def _join(self, joining: list[Request], tick: float) -> None:
        chosen = {id(r) for r in joining}
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        prefilled = _prefill_queries(self.lm, [(r.compressed, r.query) for r in joining], self.pad_id, self.masked)
        keys = [r.key for r in joining]
        if self.running is None:
            self.running = Running.open(self.batch_size, *prefilled, keys)
        else:
            self.running.join(*prefilled, keys)
        share = (clock(self.lm.device) - tick) / len(joining)
        for key in keys:
            self.spent[key] += share

    def _answer(self, key) -> Answer:
        del self.requests[key]
        ids, seconds = self.generated.pop(key), self.spent.pop(key)
        self.finished += 1
        return Answer(text=self.lm.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids, seconds=seconds)


def answer_batch(
    lm: LoadedModel,
    items: list[tuple[Compressed, torch.Tensor]],
    max_new_tokens: int | list[int],
    stop_at_eos: bool = True,
    batch_size: int | None = None,
    masked: bool = False,
) -> list[Answer]:
    """Greedy answers to many (compressed cache, query ids (1, q)) pairs, in order, decoded by one ``Decoder`` of
    ``batch_size`` places (None: all at once). ``max_new_tokens``: one budget for all, or one per item. With one item
    this is kvpress's pipeline decode (``generate_answer``)."""
    budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(items)
    if len(budgets) != len(items):
        raise ValueError(f"need one token budget per item: {len(items)} items, {len(budgets)} budgets")
    if not items:
        return []
    decoder = Decoder(lm, batch_size or len(items), stop_at_eos, masked)
    for index, ((compressed, query), budget) in enumerate(zip(items, budgets)):
        decoder.add(Request(index, compressed, query, budget))
    answers = dict(decoder.answers(drain=True))
    return [answers[index] for index in range(len(items))]


def answer(
    lm: LoadedModel, compressed: Compressed, query_ids: torch.Tensor, max_new_tokens: int, stop_at_eos: bool = True
) -> Answer:
    """Greedy answer to one query on the compressed cache (batch size 1, as kvpress's pipeline)."""
    return answer_batch(lm, [(compressed, query_ids)], max_new_tokens, stop_at_eos)[0]
