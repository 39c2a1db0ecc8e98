"""Record which prefix positions a press keeps, per layer and KV head.

``ScorerPress.compress`` throws its kept indices away. ``RecordingPress`` wraps any ScorerPress and compresses
exactly as ``ScorerPress.compress`` does (same scores, same ``compute_n_kept`` budget, same top-k, same gather order),
keeping the chosen indices. Variants that change the selection (whitelist, fair eviction) override ``select``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import BasePress, ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn


@dataclass
class RecordingPress(BasePress):
    """Compress like ``press`` and store the kept positions: ``kept[layer]`` is (batch, kv_heads, n_kept), sorted."""

    press: ScorerPress
    kept: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    @property
    def compression_ratio(self) -> float:
        return self.press.compression_ratio

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    def select(self, module: nn.Module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """Indices (batch, kv_heads, n_kept) of the entries to keep, in the press's top-k order."""
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        return scores.topk(compute_n_kept(keys.shape[2], self.compression_ratio), dim=-1).indices

    def compress(self, module: nn.Module, hidden_states, keys, values, attentions, kwargs):
        batch, heads, k_len, _ = keys.shape
        if self.compression_ratio == 0:
            self.kept[module.layer_idx] = torch.arange(k_len, device=keys.device).expand(batch, heads, k_len)
            return keys, values
        indices = self.select(module, hidden_states, keys, values, attentions, kwargs)
        self.kept[module.layer_idx] = indices.sort(dim=-1).values
        gather = indices.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
        return keys.gather(2, gather).contiguous(), values.gather(2, gather).contiguous()
