"""The press fairkv runs: a kvpress policy in one of its variants, recording which positions it keeps.

``ScorerPress.compress`` throws its kept indices away. ``RecordingPress`` wraps any of the five policies' presses,
selects with ``selection.choose`` (for the base variant exactly ``ScorerPress.compress``: same scores, same
``compute_n_kept`` budget, same top-k, same gather order), stores ``kept[layer]`` = (batch, kv_heads, n_kept) sorted
positions, and gathers keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import BasePress, ScorerPress
from torch import nn

from fairkv.core.presses.registry import check_variant, policy_of
from fairkv.core.presses.selection import check_lam, check_spans, choose, gather_kept


@dataclass
class RecordingPress(BasePress):
    """Compress like ``press`` in ``variant`` (base, whitelist, fair, fair+whitelist) and record the kept positions.

    ``spans`` (token ranges partitioning the prefix) are needed by fair variants, ``protected`` (whitelist positions)
    by whitelist variants; ``lam`` is the debiasing weight of Appendix G (1 = fair eviction, 0 = base policy).
    """

    press: ScorerPress
    variant: str = "base"
    spans: tuple[tuple[int, int], ...] = ()
    protected: tuple[int, ...] = ()
    lam: float = 1.0
    keep_only_whitelist: bool = False
    kept: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        check_variant(self.variant)
        check_lam(self.lam)
        self.spans = tuple((int(s), int(e)) for s, e in self.spans)
        self.protected = tuple(int(p) for p in self.protected)
        if self.spans:
            check_spans(self.spans, self.spans[-1][1])

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
            "local": lambda: policy.local_scores(self.press, *args, self.spans),
        }
        indices = choose(
            lambda kind: scorers[kind](),
            (batch, heads, n),
            self.compression_ratio,
            self.variant,
            self.lam,
            self.spans,
            self.protected,
            self.keep_only_whitelist,
            policy.reserved_positions(self.press, n),
        ).to(keys.device)
        keys, values, self.kept[module.layer_idx] = gather_kept(keys, values, indices)
        return keys, values
