"""Fair eviction (Section 5.2, Algorithm 1, Appendix F) and its lambda debiasing (Appendix G), for N spans.

Per KV head: the base policy (with the whitelist, if any) decides how many of each span's tokens it would keep
(b_k^default); the span budgets are b_k(lam) = lam * b_k^fair + (1 - lam) * b_k^default, apportioned to integers that
sum to the base budget (``budget.debiased_budgets``); each span then keeps the top b_k of its span-local scores
(``scoring.span_local_scores``: Appendix F's per-policy adaptation, so no span's queries vote for another span's
keys). Whitelisted tokens are kept first and count inside their span's budget. lam = 1 is fair eviction (equal keep
rates); lam = 0 returns the base policy's selection unchanged.

Differs from the paper: it defines two spans; this takes any number. For 0 < lam < 1 the budgets blend as Appendix G
says and tokens are ranked by the span-local scores (the paper does not say which scores rank them); only lam = 0
switches back to the base policy's own ranking, so that it reproduces the base policy exactly.
Differs from the authors' code: their fair presses ignore the whitelist; here the two compose.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress.utils import compute_n_kept

from fairkv.presses.budget import debiased_budgets
from fairkv.presses.scoring import span_local_scores
from fairkv.presses.whitelist import WhitelistPress


class SpanError(ValueError):
    """Spans that do not partition the prefix."""


def check_spans(spans: tuple[tuple[int, int], ...], n: int) -> None:
    """Spans must be non-empty, in order, adjacent and disjoint, and cover [0, n)."""
    if not spans:
        raise SpanError("fair eviction needs at least one span")
    for start, end in spans:
        if not start < end:
            raise SpanError(f"empty or reversed span ({start}, {end})")
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise SpanError(f"overlapping spans: one ends at {end}, the next starts at {start}")
        if start > end:
            raise SpanError(f"gap between spans: tokens {end}..{start - 1} belong to no span")
    if spans[0][0] != 0 or spans[-1][1] != n:
        raise SpanError(f"spans cover [{spans[0][0]}, {spans[-1][1]}) but the prefix has {n} tokens")


@dataclass
class FairPress(WhitelistPress):
    """Fair eviction of ``press`` over token ``spans`` with debiasing weight ``lam`` (1 = fair, 0 = base)."""

    spans: tuple[tuple[int, int], ...] = ()
    lam: float = 1.0

    def __post_init__(self):
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam = {self.lam} is outside [0, 1]: 0 is the base policy, 1 fair eviction")
        self.spans = tuple((int(s), int(e)) for s, e in self.spans)
        if self.spans:
            check_spans(self.spans, self.spans[-1][1])

    def select(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        batch, heads, n, _ = keys.shape
        check_spans(self.spans, n)
        base = super().select(module, hidden_states, keys, values, attentions, kwargs)
        n_kept = compute_n_kept(n, self.compression_ratio)
        if self.lam == 0.0 or base.shape[-1] != n_kept:  # base policy, or the whitelist-only opt-in
            return base
        scores = span_local_scores(self.press, module, hidden_states, keys, values, attentions, kwargs, self.spans)
        scores = scores.float().clone()
        scores[..., list(self.protected)] = float("inf")
        lengths = [end - start for start, end in self.spans]
        protected = [sum(start <= p < end for p in self.protected) for start, end in self.spans]
        base_mask = torch.zeros(batch, heads, n, dtype=torch.bool, device=keys.device).scatter_(-1, base, True)
        chosen = torch.empty(batch, heads, n_kept, dtype=torch.long, device=keys.device)
        for b in range(batch):
            for h in range(heads):
                default = [int(base_mask[b, h, start:end].sum()) for start, end in self.spans]
                budgets = debiased_budgets(n_kept, lengths, protected, default, self.lam)
                picks = [
                    scores[b, h, start:end].topk(k).indices + start
                    for (start, end), k in zip(self.spans, budgets) if k > 0
                ]
                chosen[b, h] = torch.cat(picks)
        return chosen
