"""Score once, cut many: one prefill per prompt yields the kept sets and caches of every policy, variant and ratio.

kvpress compresses a layer's cache in a hook that runs after that layer's attention, so the prefill's hidden states,
keys, values and attention weights never depend on the press: the scores a press computes at any ratio are the
scores of the one uncompressed prefill. ``prefill`` runs it once with a collector that stores, per layer and policy,
the three kinds of scores ``presses.selection.choose`` reads; ``cut`` applies ``choose`` to them at any
(policy, variant, lam, ratio) and gathers the full cache: the same kept sets and the same compressed cache (same
gather order) as running ``RecordingPress`` at that setting, without another forward pass.

This is the score-once backend of the press catalogue (``presses.policy.SCORE_ONCE``). Out of scope: presses whose
scores depend on the ratio other than StreamingLLM (handled: its kvpress score is rebuilt from the key shape at cut
time), that draw random numbers or keep a different number of tokens per head: the per-setting backend
(``fairkv.core.per_setting``) builds those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import BasePress
from transformers import DynamicCache

from fairkv.core.generation import Compressed, check_policy_fits
from fairkv.core.models import LoadedModel, clock
from fairkv.core.presses import PolicyError, Setting, check_ratio, get_policy, make_press
from fairkv.core.presses.policy import SCORE_ONCE
from fairkv.core.presses.selection import choose, gather_kept
from fairkv.core.prompts import Prompt


@dataclass
class _ScoreCollector(BasePress):
    """Stores every policy's "press", "ranking" and "local" scores per layer; compresses nothing."""

    policies: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    scores: dict[tuple[str, int], dict[str, torch.Tensor]] = field(default_factory=dict)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        args = (module, hidden_states, keys, values, attentions, kwargs)
        for policy in self.policies:
            spec = get_policy(policy)
            press = spec.build(0.5)  # the ratio does not enter these scores (a ranking's press score: see ``cut``)
            entry = {"ranking": spec.ranking_scores(press, *args), "local": spec.local_scores(press, *args, self.spans)}
            if spec.rank is None:
                entry["press"] = entry["ranking"]  # the ranking is the press's own score
            self.scores[(policy, module.layer_idx)] = entry
        return keys, values


@dataclass
class Prefilled:
    """The uncompressed prefill of one prompt: its full cache and every policy's scores per layer."""

    prompt: Prompt
    cache: DynamicCache
    scores: dict[tuple[str, int], dict[str, torch.Tensor]]
    seconds: float

    @property
    def n_layers(self) -> int:
        return len(self.cache.layers)


@torch.inference_mode()
def prefill(lm: LoadedModel, prompt: Prompt, policies: tuple[str, ...]) -> Prefilled:
    """One forward pass over the prefix, keeping the full cache and the scores of ``policies``."""
    for policy in policies:
        if get_policy(policy).backend != SCORE_ONCE:
            raise PolicyError(
                f"{policy!r} is built per setting (fairkv.core.per_setting), not scored once: run it in a grid "
                "(fairkv.runs.experiment.run), which builds each setting by its press's backend"
            )
        check_policy_fits(lm, prompt, policy)
    collector = _ScoreCollector(tuple(policies), prompt.marks.spans)
    cache = DynamicCache()
    start = clock(lm.device)
    with collector(lm.model):
        lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
    return Prefilled(prompt, cache, collector.scores, clock(lm.device) - start)


def cut(prefilled: Prefilled, setting: Setting, keep_only_whitelist: bool = False) -> Compressed:
    """The compressed cache and kept positions of ``setting`` (policy, variant, lam, ratio), from the stored scores."""
    policy, ratio = setting.policy, check_ratio(setting.ratio)
    prompt, marks = prefilled.prompt, prefilled.prompt.marks
    if policy is not None:
        marks.require(setting)
    device = prefilled.cache.layers[0].keys.device
    start = clock(device)
    cache, kept = DynamicCache(), {}
    for layer in range(prefilled.n_layers):
        keys, values = prefilled.cache.layers[layer].keys, prefilled.cache.layers[layer].values
        batch, heads, n, _ = keys.shape
        if policy is None or ratio == 0.0:
            if policy is not None:
                kept[layer] = torch.arange(n, device=keys.device).expand(batch, heads, n)
            cache.update(keys, values, layer)
            continue
        entry, spec, press = prefilled.scores[(policy, layer)], get_policy(policy), make_press(policy, ratio)

        def scores(kind: str, entry=entry, keys=keys, press=press) -> torch.Tensor:
            return entry[kind] if kind in entry else spec.ratio_scores(press, keys)

        reserved = spec.reserved_positions(press, n)
        indices = choose(scores, (batch, heads, n), setting, marks, keep_only_whitelist, reserved)
        kept_keys, kept_values, kept[layer] = gather_kept(keys, values, indices.to(keys.device))
        cache.update(kept_keys, kept_values, layer)
    return Compressed(cache, prompt.n_tokens, kept, clock(device) - start, setting)
