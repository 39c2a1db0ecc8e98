"""Scores that rank prefix tokens: the base policy's, and the span-local ones of fair eviction (Appendix F).

A policy ranks by its press's score with one change (``streaming_scores``, StreamingLLM's ``rank`` in the registry):
StreamingLLM's kvpress score is 1 for sinks and window and 0 elsewhere, which ties once a whitelist or a per-span
budget asks for fewer tokens than the window holds; we rank by position instead (sinks first, then recency), which
keeps exactly kvpress's set at its own budget and "the most recent tokens" at any other.

The span-local scores implement the per-policy adaptations of Appendix F so that one span's queries never score
another span's keys (each policy's ``local`` in ``fairkv.core.presses.policies``). Scores are only compared within a
span. Shapes: attentions (batch, heads, n, n); scores (batch, kv_heads, n). SnapKV, H2O and TOVA read the attention weights the eager attention layer returns.

Relation to the authors' code: their SnapKV later window includes the template suffix and their TOVA's second anchor
is the last prompt token. Here each span's window and anchor are the span's own tail (Appendix F.4, F.7) for any
number of spans; since the paper's spans absorb the template suffix into the last span, the last span's tail is the
prompt's tail, as in their code, and every earlier span uses its own tail, as in the paper. Their fair H2O masks and
normalises attention over the raw instruction spans; here over the spans as the prompt cuts them (the first absorbs
the chat header, the last the template suffix), so that every prefix token belongs to a span and is scored (F.5
names the spans, not how the header and suffix are split). Measured on Fig 9's H2O row (benchmarks/fair_h2o_spans.py,
Qwen2.5-Coder-1.5B bfloat16, 100 prompts, r = 0.3 / 0.5 / 0.7): 99.6 / 99.6 / 99.3% of the kept positions are the same,
refusal differs by -0.02 [-0.07, +0.02] / +0.00 / +0.00 and directive leakage by at most 0.004: no measurable effect.
K-Norm, SnapKV, TOVA and StreamingLLM against the authors' fork (benchmarks/fair_authors.py, 50 prompts, r = 0.3 / 0.5
/ 0.7): inside each span both keep the same tokens; they part only where the authors give the earlier span
floor(n_kept x its share) and we apportion by largest remainder (one token more or less), at r = 0.3 and 0.7 on 34 and
36 of 50 prompts (StreamingLLM: 4 of 50 at r = 0.7), with no measurable effect on refusal or leakage.

Beyond the paper, every other score-once policy of the registry gets its span-local scores by its ``scoring`` kind
(``policy.KIND_SCORERS``):

- "independent" (a token's score reads only that token: K-Norm, Random): the press's own score is already local;
- "cross-token" (the score reads other tokens' queries, keys or values): each span is scored as a prompt of its own
  (``span_as_prompt``): the press's ``score`` sees only the span's hidden states, keys and values, with the keys
  re-rotated to start at position 0 and the RoPE tables of positions 0 .. len - 1, exactly what it would see if the
  span were the whole prefix. Whatever a press does at the start of a prefix (the 4 sinks of ExpectedAttention, LagKV
  and CUR) it does at each span's start.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from kvpress import ScorerPress, SnapKVPress, StreamingLLMPress

from fairkv.core.presses.budget import window_split

Spans = Sequence[tuple[int, int]]


def streaming_scores(press: StreamingLLMPress, keys: torch.Tensor) -> torch.Tensor:
    """Sinks first (+inf), then later positions higher: top-k keeps the sinks and the most recent tokens."""
    batch, heads, n, _ = keys.shape
    scores = torch.arange(n, dtype=torch.float32, device=keys.device).expand(batch, heads, n).clone()
    scores[..., : press.n_sink] = float("inf")
    return scores


def _need_attentions(attentions, policy: str) -> torch.Tensor:
    if attentions is None:
        raise ValueError(f"span-local {policy} scoring needs attention weights: load the model with eager attention")
    return attentions


def _group_mean(scores: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(batch, heads, L) -> (batch, kv_heads, L): mean over the query heads that share a KV head."""
    batch, heads, length = scores.shape
    return scores.view(batch, kv_heads, heads // kv_heads, length).mean(2)


def snapkv_local(press: SnapKVPress, keys, attentions, spans: Spans) -> torch.Tensor:
    """F.4: window W split across spans; span k's last W_k queries vote over span k's keys before its window,
    mean over the window queries, pooled (kernel) inside the span, window tokens ranked first."""
    attentions = _need_attentions(attentions, "SnapKV")
    batch, kv_heads, n, _ = keys.shape
    scores = torch.zeros(batch, kv_heads, n, dtype=torch.float32, device=keys.device)
    for (start, end), window in zip(spans, window_split(press.window_size, len(spans))):
        split = end - window
        if window == 0 or split <= start:  # the whole span is its window
            scores[..., start:end] = 1.0
            continue
        votes = attentions[:, :, split:end, start:split].float().mean(dim=2)  # (batch, heads, split - start)
        votes = F.avg_pool1d(votes, kernel_size=press.kernel_size, padding=press.kernel_size // 2, stride=1)
        votes = _group_mean(votes, kv_heads)
        scores[..., start:split] = votes
        scores[..., split:end] = votes.max() + 1
    return scores


def h2o_local(keys, attentions, spans: Spans) -> torch.Tensor:
    """F.5: attention from another span's queries is zeroed; each key's score is the mean attention it receives
    from the causal queries of its own span, divided by their actual number (end - position)."""
    attentions = _need_attentions(attentions, "H2O")
    batch, kv_heads, n, _ = keys.shape
    scores = torch.zeros(batch, kv_heads, n, dtype=torch.float32, device=keys.device)
    for start, end in spans:
        received = attentions[:, :, start:end, start:end].float().sum(dim=2)  # (batch, heads, L)
        eligible = torch.arange(end - start, 0, -1, device=keys.device, dtype=torch.float32)
        scores[..., start:end] = _group_mean(received / eligible, kv_heads)
    return scores


def tova_local(keys, attentions, spans: Spans) -> torch.Tensor:
    """F.7: one anchor per span (its last token) scores the span's earlier keys; mean over heads; anchor first."""
    attentions = _need_attentions(attentions, "TOVA")
    batch, kv_heads, n, _ = keys.shape
    scores = torch.zeros(batch, kv_heads, n, dtype=torch.float32, device=keys.device)
    for start, end in spans:
        anchor = end - 1
        weights = attentions[:, :, anchor, start:anchor].float().mean(dim=1, keepdim=True)  # (batch, 1, L - 1)
        scores[..., start:anchor] = weights
        scores[..., anchor] = weights.max() + 1 if anchor > start else 1.0
    return scores


def knorm_local(
    press, module, hidden_states, keys, values, attentions, kwargs, spans
) -> torch.Tensor:  # 8 parameters: kvpress's score arguments and the spans
    """F.6: K-Norm has no cross-token interaction; its scores are unchanged, only the budget split differs."""
    return press.score(module, hidden_states, keys, values, attentions, kwargs)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def shift_keys(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int) -> torch.Tensor:
    """Keys (batch, kv_heads, L, d) rotated at positions start .. start + L - 1, rotated back by ``start`` (RoPE is a
    rotation per frequency: R(p) R(-s) = R(p - s)); ``cos``/``sin`` (batch, n, d) are the prefix's RoPE tables."""
    if start == 0:
        return keys
    c, s = cos[:, start].unsqueeze(1).unsqueeze(2), sin[:, start].unsqueeze(1).unsqueeze(2)
    return (keys.float() * c.float() - _rotate_half(keys.float()) * s.float()).to(keys.dtype)


def span_as_prompt(
    press: ScorerPress, module, hidden_states, keys, values, attentions, kwargs, spans
) -> torch.Tensor:  # 8 parameters: kvpress's score arguments and the spans
    """Scores (batch, kv_heads, n): each span scored by ``press`` as if it were the whole prefix (see module doc)."""
    if (
        getattr(module.config, "rope_scaling", None) not in (None, {})
        and module.config.rope_scaling.get("rope_type", "default") != "default"
    ):
        raise NotImplementedError(
            f"span-local scoring re-rotates keys by plain RoPE; this model scales it ({module.config.rope_scaling})"
        )
    cos, sin = kwargs["position_embeddings"]
    batch, kv_heads, n, _ = keys.shape
    scores = torch.zeros(batch, kv_heads, n, dtype=torch.float32, device=keys.device)
    for start, end in spans:
        length = end - start
        local = {
            **kwargs,
            "hidden_states": hidden_states[:, start:end],
            "position_embeddings": (cos[:, :length], sin[:, :length]),
            "cache_position": torch.arange(length, device=keys.device),
        }
        scores[..., start:end] = press.score(
            module,
            hidden_states[:, start:end],
            shift_keys(keys[:, :, start:end], cos, sin, start),
            values[:, :, start:end],
            None,
            local,
        ).float()
    return scores


def independent_scores(
    press, module, hidden_states, keys, values, attentions, kwargs, spans
) -> torch.Tensor:  # 8 parameters: kvpress's score arguments and the spans
    return press.score(module, hidden_states, keys, values, None, kwargs)
