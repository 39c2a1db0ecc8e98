"""Keep rate of a span (Section 4, Fig 7): |kept ∩ span| / |span| per KV head, mean over heads, then over layers
(the authors' code's order of averaging), from the kept positions a press records (``RecordingPress.kept``,
``FairPress.kept``) or from per-layer masks of kept positions (the press atlas).

Part of the core a kvpress user installs alone (torch, transformers, kvpress).
"""

from __future__ import annotations

from typing import Sequence

import torch

from fairkv.core.prompts import Span


def keep_rates(kept: dict[int, torch.Tensor], spans: Sequence[Span], n_tokens: int) -> dict[str, float]:
    """Keep rate per span from the kept positions (batch, kv_heads, n_kept) of each layer (``span_rates``)."""
    if not kept:
        return {span.name: 1.0 for span in spans}
    masks = []
    for indices in kept.values():
        mask = torch.zeros(*indices.shape[:2], n_tokens, dtype=torch.bool, device=indices.device)
        masks.append(mask.scatter_(-1, indices, True))
    return span_rates(masks, spans)


def keep_map(kept: dict[int, torch.Tensor], n_tokens: int) -> torch.Tensor:
    """Fraction of (layer, KV head) pairs that keep each prefix position: (n_tokens,) in [0, 1]."""
    if not kept:
        return torch.ones(n_tokens)
    total = torch.zeros(n_tokens)
    count = 0
    for indices in kept.values():
        mask = torch.zeros(*indices.shape[:2], n_tokens)
        mask.scatter_(-1, indices.cpu(), 1.0)
        total += mask.sum(dim=(0, 1))
        count += indices.shape[0] * indices.shape[1]
    return total / count


def span_rates(masks: list[torch.Tensor], spans) -> dict[str, float]:
    """Keep rate per span from per-layer masks of kept positions (kept sets of any size per head): per layer the
    mean over KV heads of |kept ∩ span| / |span|, then the mean over layers."""
    rates = torch.stack([torch.stack([m[..., s.start : s.end].float().mean(-1).mean() for s in spans]) for m in masks])
    return {span.name: float(rate) for span, rate in zip(spans, rates.mean(0))}
