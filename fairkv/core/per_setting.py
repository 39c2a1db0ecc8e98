"""The per-setting backend: a press's own ``compress`` at each (variant, ratio), for the presses that cannot be scored
once (beyond the paper).

The score-once backend (``fairkv.core.score_once``) scores a press once and cuts the top-k of those scores at every
ratio. kvpress's wrappers around SnapKV do not work that way: AdaKV and CriticalAdaKV keep a different number of tokens
in each KV head (one top-k over heads x tokens), CriticalKV's two-stage score reads the ratio, Block scores the prefix
block by block, LeverageScore and Compactor draw a sketch at every call (each policy of ``registry.REGISTRY`` declares
its backend). Here each press is run by its own kvpress ``compress`` at each (variant, ratio) on the one
uncompressed prefill of a prompt (``kept.press_mask``; no press is re-implemented), and the mitigations change only
what Section 5 and Appendix F change:

- whitelist (Section 5.1): the whitelisted tokens score the dtype's maximum in the score the press selects by (its
  own when it is a ``ScorerPress``, as CriticalKV, else its inner press's), so the press's own rule keeps them
  (AdaKV's top-k over heads, Block's top-k in each block). A whitelist larger than the budget is an error
  (``selection.check_whitelist``), and so is a kept set that lacks a whitelisted token. Positions are found by their
  keys: Block scores subsets of the prefix, and keys are distinct copies (as in ``kept.kept_mask``).
- boundary protection (``selection.boundary_positions``): its reserve is kept as the whitelist is.
- fair eviction (Algorithm 1; Appendix F: "one span's queries never score another span's keys"): each span gets its
  share of the press's kept total (``budget.fair_budgets``, whitelisted tokens counted inside their span) and keeps
  what the press keeps when that span is the whole prompt at that budget (``scoring.span_as_prompt``: the span's
  hidden states, its keys re-rotated to start at 0, its values). AdaKV's top-k over heads x tokens runs inside each
  span with the span's budget times the heads, so its head-wise adaptation stays, within the span.

Head-masked caches: a kept set that differs per head cannot be gathered into one cache. The compressed cache keeps
every position and marks the evicted keys NaN; they decode with ``attention.head_masked_attention``
(``generation.answer_batch(..., masked=True)``), whatever the press.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from kvpress import BasePress, ScorerPress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

from fairkv.core import generation, models, prompts
from fairkv.core.presses import kept
from fairkv.core.presses.budget import fair_budgets
from fairkv.core.presses.policy import Policy, PolicyError
from fairkv.core.presses.registry import get_policy
from fairkv.core.presses.scoring import span_as_prompt
from fairkv.core.presses.selection import Marks, check_whitelist, protected_positions
from fairkv.core.presses.setting import Setting


@dataclass(frozen=True)
class Layer:
    """What kvpress's compression hook gives a press in one layer (after the layer's attention)."""

    module: torch.nn.Module
    hidden_states: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    kwargs: dict


def _protect(press: BasePress, protected_keys: torch.Tensor) -> BasePress:
    """``press`` with its selecting score (its own for a ``ScorerPress``, else its inner press's) raised to the dtype's
    maximum at the keys ``protected_keys`` (batch, kv_heads, w, d): the whitelisted tokens, wherever they sit in the
    keys the score is given."""
    scorer = press if isinstance(press, ScorerPress) else getattr(press, "press", None)
    if not isinstance(scorer, ScorerPress):
        raise PolicyError(f"{type(press).__name__} has no score to whitelist by (not a ScorerPress, no inner one)")
    score = scorer.score

    def protected_score(module, hidden_states, keys, values, attentions, kwargs):
        scores = score(module, hidden_states, keys, values, attentions, kwargs)
        hit = (keys.unsqueeze(3) == protected_keys.unsqueeze(2)).all(-1).any(-1)
        return scores.masked_fill(hit, torch.finfo(scores.dtype).max)

    scorer.score = protected_score  # on a press built for this one call
    return press


def press_mask(entry: Policy, ratio: float, protected, layer: Layer, model) -> torch.Tensor:
    """(batch, kv_heads, n) kept positions of ``entry``'s press at ``ratio`` on the n tokens of ``layer``, the
    positions ``protected`` scored first (the whitelist)."""
    press = entry.build(ratio)
    press.post_init_from_model(model)
    if protected:
        press = _protect(press, layer.keys[:, :, list(protected)])
    return kept.press_mask(press, layer.module, layer.hidden_states, layer.keys, layer.values, None, layer.kwargs)


class _SpanKeeper:
    """What ``scoring.span_as_prompt`` scores each span with, span after span: ``press_mask`` of the span alone
    keeping its budget (at the ratio where kvpress's ``compute_n_kept`` gives it), as 1.0 (kept) / 0.0."""

    def __init__(self, entry: Policy, budgets: list[int], protected: list[tuple[int, ...]], model):
        self.entry, self.model, self.todo = entry, model, list(zip(budgets, protected))

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        budget, protected = self.todo.pop(0)
        batch, heads, length, _ = keys.shape
        if budget in (0, length):
            return torch.full((batch, heads, length), float(budget == length))
        ratio = 1.0 - (budget + 0.5) / length
        assert compute_n_kept(length, ratio) == budget, (budget, length, ratio)
        span = Layer(module, hidden_states, keys, values, kwargs)
        return press_mask(self.entry, ratio, protected, span, self.model).float()


def setting_mask(entry: Policy, setting: Setting, marks: Marks, layer: Layer, model) -> torch.Tensor:
    """(batch, kv_heads, n) positions ``entry``'s press keeps in ``layer`` in ``setting``'s variant (base, whitelist,
    fair, fair+whitelist, boundary: its reserve kept as a whitelist; see the module doc) at its ratio; ``marks``: the
    prompt's spans and whitelist positions."""
    batch, heads, n, _ = layer.keys.shape
    variant, ratio, spans = setting.variant, setting.ratio, marks.spans
    n_kept = compute_n_kept(n, ratio)
    whitelist = protected_positions(setting, marks, n, n_kept)
    check_whitelist(whitelist, n, n_kept, False, ratio)
    if not variant.fair:
        mask = press_mask(entry, ratio, whitelist, layer, model)
    else:
        inside = [tuple(p - start for p in whitelist if start <= p < end) for start, end in spans]
        budgets = fair_budgets(n_kept, [end - start for start, end in spans], [len(w) for w in inside])
        keeper = _SpanKeeper(entry, budgets, inside, model)
        mask = span_as_prompt(
            keeper, layer.module, layer.hidden_states, layer.keys, layer.values, None, layer.kwargs, spans
        ).bool()
    if whitelist and not mask[..., list(whitelist)].all():
        raise PolicyError(f"{entry.label} ({variant}, r = {ratio}) evicted a whitelisted token")
    return mask


class _Masks(BasePress):
    """Per layer, the kept mask of every setting asked (each a ``Setting``), on the
    layer's uncompressed prefill; compresses nothing."""

    def __init__(self, settings: list, prompt: prompts.Prompt):
        self.settings, self.marks = settings, prompt.marks
        self.masks: dict = {s: [] for s in settings}
        self.entries = {s: get_policy(s.policy) for s in settings}

    def post_init_from_model(self, model):
        self.model = model

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        layer = Layer(module, hidden_states, keys, values, kwargs)
        for setting, entry in self.entries.items():
            try:
                mask = setting_mask(entry, setting, self.marks, layer, self.model)
            except kept.PRESS_FAILURES as error:
                raise PolicyError(
                    f"{entry.label} ({setting.variant}, r = {setting.ratio}) raised on this prompt "
                    f"in layer {module.layer_idx}: {error}"
                ) from error
            self.masks[setting].append(mask)
        return keys, values


@contextmanager
def head_dim_known(model):
    """CriticalKV reads ``config.head_dim``, which Qwen2's config derives rather than stores: set for the block (to
    the value the model uses), and removed after it when the config had none."""
    config = model.config
    missing = not hasattr(config, "head_dim")
    if missing:
        config.head_dim = config.hidden_size // config.num_attention_heads
    try:
        yield
    finally:
        if missing:
            del config.head_dim


@torch.inference_mode()
def compressed(lm: models.LoadedModel, prompt: prompts.Prompt, settings: list):
    """({setting: ``generation.Compressed``}, the prefill's seconds) from one prefill of ``prompt``: head-masked caches
    (evicted keys NaN) and the kept positions of each setting; r = 0 (policy None) is the uncompressed cache."""
    collector = _Masks([s for s in settings if s.policy is not None], prompt)
    cache = DynamicCache()
    start = time.perf_counter()
    with head_dim_known(lm.model), collector(lm.model):
        lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
    prefill_s = time.perf_counter() - start
    out = {}
    for setting in settings:
        start = time.perf_counter()
        masked, positions = DynamicCache(), {}
        for layer, entry in enumerate(cache.layers):
            keys = entry.keys
            if setting.policy is not None:
                mask = collector.masks[setting][layer].to(keys.device)
                keys = keys.masked_fill(~mask.unsqueeze(-1), float("nan"))
                positions[layer] = kept.kept_indices(mask.cpu())
            masked.update(keys, entry.values, layer)
        out[setting] = generation.Compressed(masked, prompt.n_tokens, positions, time.perf_counter() - start, setting)
    return out, prefill_s
