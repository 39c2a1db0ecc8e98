"""Which prefix positions a kvpress press keeps, read from its own ``compress``: no press is re-implemented.

kvpress compresses a layer's cache in a hook after that layer's attention, so the hook's inputs never depend on the
press, and any press's ``compress`` can be called on them. The kept keys it returns are gathered copies of prefix
keys (``kept_mask`` finds them by their bits); AdaKV-style presses keep the cache's shape and mask instead, and the
mask's indices say what they evicted. Presses that draw random numbers (Random, LeverageScore's sketch) draw them
seeded by ``SEED`` + the layer.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from kvpress import BasePress

from fairkv.core.attention import implementation
from fairkv.core.presses.policy import PolicyError

SEED = 0

# what a kvpress press raises when it cannot compress a prompt (SnapKV inside a chunk shorter than its window, ...)
PRESS_FAILURES = (AssertionError, ValueError, RuntimeError, IndexError)


def kept_mask(keys: torch.Tensor, kept_keys: torch.Tensor, masked=None) -> torch.Tensor:
    """(batch, kv_heads, n) True where a position was kept: ``kept_keys`` (batch, kv_heads, k, d) are gathered copies
    of ``keys`` (batch, kv_heads, n, d), found by an exact match; ``masked`` (batch, head, position index tensors,
    kvpress's ``masked_key_indices``) marks evicted positions of a press that keeps the cache's shape."""
    batch, heads, n, dim = keys.shape
    if masked is not None:
        mask = torch.ones(batch, heads, n, dtype=torch.bool)
        mask[masked[0].cpu(), masked[1].cpu(), masked[2].cpu()] = False
        return mask
    if kept_keys.shape[2] == n:
        return torch.ones(batch, heads, n, dtype=torch.bool)
    signature = lambda k: _bits(k) @ _multipliers(dim)  # exact integer arithmetic: equal keys, equal signatures
    keys_signature = signature(keys)  # (batch, heads, n)
    order = keys_signature.argsort(-1)
    ordered = keys_signature.gather(-1, order)
    found = torch.searchsorted(ordered, signature(kept_keys)).clamp(max=n - 1)
    positions = order.gather(-1, found)
    exact = keys.cpu().gather(2, positions.unsqueeze(-1).expand(-1, -1, -1, dim)).equal(kept_keys.cpu())
    if not exact or (ordered[..., 1:] == ordered[..., :-1]).any():
        raise PolicyError(
            "the press returned keys that are not copies of distinct prefix keys: its kept set cannot be read"
        )
    return torch.zeros(batch, heads, n, dtype=torch.bool).scatter_(-1, positions, True)


def _bits(keys: torch.Tensor) -> torch.Tensor:
    """The keys' raw bits as int64 (float32 and bfloat16 alike)."""
    integer = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[keys.dtype]
    return keys.detach().cpu().contiguous().view(integer).long()


def _multipliers(dim: int) -> torch.Tensor:
    return torch.randint(1, 2**62, (dim,), generator=torch.Generator().manual_seed(SEED), dtype=torch.int64)


@contextmanager
def _masking_allowed(module):
    """AdaKV-style presses refuse eager attention because their decoding-time masking patch does not cover it; the
    atlas only reads which keys they mask, so the check is lifted for the call, and the mask cleared after it."""
    try:
        with implementation(module.config, "sdpa"):
            yield
    finally:
        module.masked_key_indices = None


def press_mask(
    press: BasePress, module, hidden_states, keys, values, attentions, kwargs
) -> torch.Tensor:  # 7 parameters: the press and kvpress's compress arguments
    """Positions (batch, kv_heads, n) that ``press`` keeps in this layer, from its own ``compress``."""
    torch.manual_seed(SEED + module.layer_idx)
    with _masking_allowed(module):
        kept_keys, _ = press.compress(module, hidden_states, keys, values, attentions, kwargs)
        masked = getattr(module, "masked_key_indices", None)
        return kept_mask(keys, kept_keys, masked)


def kept_indices(mask: torch.Tensor) -> torch.Tensor:
    """(batch, kv_heads, k) kept positions of ``mask`` (batch, kv_heads, n), k the largest count over heads; a head that
    keeps fewer repeats its first position, so that ``rates.keep_rates`` (a scatter) reads its exact set."""
    count = mask.sum(-1, keepdim=True)
    most = int(count.max())
    order = (~mask).int().argsort(dim=-1, stable=True)[..., :most]
    return torch.where(torch.arange(most) < count, order, order[..., :1])
