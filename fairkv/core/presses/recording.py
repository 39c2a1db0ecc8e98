"""The press fairkv runs: a kvpress policy in one of its variants, recording which positions it keeps.

``ScorerPress.compress`` throws its kept indices away. ``RecordingPress`` wraps any of the five policies' presses,
selects with ``selection.choose`` (for the base variant exactly ``ScorerPress.compress``: same scores, same
``compute_n_kept`` budget, same top-k, same gather order), stores ``kept[layer]`` = (batch, kv_heads, n_kept) sorted
positions, and gathers keys and values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from kvpress import BasePress, ScorerPress
from torch import nn

from fairkv.core.presses.registry import policy_of
from fairkv.core.presses.selection import Marks, choose, gather_kept
from fairkv.core.presses.setting import Setting


@dataclass
class RecordingPress(BasePress):
    """Compress like ``press`` in ``setting``'s variant (base, whitelist, fair, fair+whitelist) and lam (the
    debiasing weight of Appendix G: 1 = fair eviction, 0 = base policy), and record the kept positions.

    ``marks``: the spans (token ranges partitioning the prefix) fair variants need and the positions whitelist
    variants protect. The ratio is the press's own (``setting.ratio`` is not read).
    """

    press: ScorerPress
    setting: Setting = Setting(None)
    marks: Marks = Marks()
    keep_only_whitelist: bool = False
    kept: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    @property
    def compression_ratio(self) -> float:
        return self.press.compression_ratio

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    def compress(self, module: nn.Module, hidden_states, keys, values, attentions, kwargs):
        batch, heads, n, _ = keys.shape
        if self.compression_ratio == 0:
            self.kept[module.layer_idx] = torch.arange(n, device=keys.device).expand(batch, heads, n)
            return keys, values
        args, policy = (module, hidden_states, keys, values, attentions, kwargs), policy_of(self.press)
        scorers = {
            "press": lambda: self.press.score(*args),
            "ranking": lambda: policy.ranking_scores(self.press, *args),
            "local": lambda: policy.local_scores(self.press, *args, self.marks.spans),
        }
        setting = dataclasses.replace(self.setting, ratio=self.compression_ratio)
        reserved = policy.reserved_positions(self.press, n)
        indices = choose(
            lambda kind: scorers[kind](), (batch, heads, n), setting, self.marks, self.keep_only_whitelist, reserved
        ).to(keys.device)
        keys, values, self.kept[module.layer_idx] = gather_kept(keys, values, indices)
        return keys, values
