"""The attention kernel of decoding: grouped-query attention that reads the cache without copying it.

Decoding never needs attention weights (only the prefill of H2O, SnapKV, TOVA and the span-local scores read them,
and they run under eager attention). transformers' eager attention repeats every KV head to the number of query
heads before its two matmuls (``repeat_kv``): at each decoding step it copies the whole cache of every layer
(Qwen2.5-1.5B: 2 KV heads for 12 query heads, six copies). ``grouped_attention`` folds the query heads that share a
KV head into the query-length axis instead, so the matmuls read the cache in place: the same operations as eager
attention (scaled matmul, additive mask, float32 softmax, matmul) on a reshaped query. ``decoding`` switches a model
to it for the duration of a decode and back (registered as ``DECODE_ATTENTION``, with eager's mask).

``head_masked_attention`` (``HEAD_MASKED``) is ``grouped_attention`` over a cache whose evicted keys differ per KV
head: as kvpress does for AdaKV (``masked_key_indices``), such a cache keeps every position and marks the evicted keys
NaN, a mark that travels with the cache through a running decode batch, and they receive weight zero
(``fairkv.core.per_setting``). ``implementation`` is the one place a model's attention kernel is swapped for a block.

Measured on this machine (``benchmarks/sweep_throughput.py``, ``benchmarks/results/``): see docs/benchmarks.md.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

DECODE_ATTENTION = "fairkv_grouped"


def grouped_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs
):  # 8 parameters: the attention-function signature transformers calls
    """Eager attention for query (batch, heads, q, d) over key / value (batch, kv_heads, L, d), kv_heads dividing
    heads, without repeating the KV heads; returns (output (batch, q, heads, d), no weights). The signature is SDPA's
    (``dropout`` sixth), the one kvpress's wrapper of every registered attention function calls."""
    batch, heads, length, dim = query.shape
    scaling = dim**-0.5 if scaling is None else scaling
    kv_heads = key.shape[1]
    group = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, group * length, dim)  # head h = kv * group + g, as repeat_kv orders them
    weights = torch.matmul(grouped, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        span = weights.shape[-1]
        weights = (weights.view(batch, kv_heads, group, length, span) + attention_mask[:, :, None, :, :span]).view(
            batch, kv_heads, group * length, span
        )
    weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(weights, value).view(batch, heads, length, dim)
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(DECODE_ATTENTION, grouped_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(DECODE_ATTENTION, eager_mask)


HEAD_MASKED = "fairkv_head_masked"


def head_masked_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs
):  # 8 parameters: the attention-function signature transformers calls
    """``grouped_attention`` where keys marked NaN (evicted in that KV head) get weight zero: the attention mask
    (batch, 1, q, L) becomes (batch, kv_heads, q, L), the dtype's minimum at the marked positions."""
    evicted = key.isnan().any(-1)  # (batch, kv_heads, L)
    if evicted.any():
        batch, kv_heads, length = evicted.shape
        key = key.masked_fill(evicted.unsqueeze(-1), 0.0)
        if attention_mask is None:
            attention_mask = query.new_zeros(batch, 1, query.shape[2], length)
        attention_mask = attention_mask[..., :length].expand(batch, kv_heads, -1, length)
        attention_mask = attention_mask.masked_fill(evicted.unsqueeze(2), torch.finfo(attention_mask.dtype).min)
    return grouped_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


AttentionInterface.register(HEAD_MASKED, head_masked_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(HEAD_MASKED, eager_mask)


@contextmanager
def implementation(config, name: str | None):
    """``config``'s attention kernel set to ``name`` inside the block (None: left as it is), its own after it."""
    before = config._attn_implementation
    if name is not None:
        config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def decoding(model, masked: bool = False):
    """Run ``model`` with ``grouped_attention`` inside the block when it uses eager attention (other kernels, e.g.
    SDPA or flash attention on a GPU, already read the cache in place and are left as they are); ``masked``: with
    ``head_masked_attention`` whatever its kernel (caches with keys evicted per head)."""
    if masked:
        return implementation(model.config, HEAD_MASKED)
    return implementation(model.config, DECODE_ATTENTION if model.config._attn_implementation == "eager" else None)
