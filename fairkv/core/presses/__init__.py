"""Eviction policies (kvpress presses with the paper's settings), their mitigations, and the kept-index recorder.

``build_press`` is the engine's entry point: a ``Setting`` (policy key, variant, lam, ratio) and the prompt's
``Marks`` (spans and whitelist in token positions). ``WhitelistPress``, ``FairPress`` and ``BoundaryPress`` are the
same mitigations as kvpress presses taking text (``native``), and ``keep_rates`` reads keep rates per span
(``rates``): with this package, the core a kvpress user installs alone (torch, transformers, kvpress), exported at
``fairkv``'s top.
"""

from __future__ import annotations

import torch

from fairkv.core.presses.budget import BudgetError
from fairkv.core.presses.recording import RecordingPress
from fairkv.core.presses.policies import PAPER
from fairkv.core.presses.policy import Policy, PolicyError, check_ratio
from fairkv.core.presses.registry import REGISTRY, get_policy, make_press
from fairkv.core.presses.selection import Marks, SpanError, WhitelistError
from fairkv.core.presses.setting import (
    BOUNDARY_SHARE,
    MITIGATIONS,
    VARIANTS,
    Setting,
    Variant,
    VariantError,
    canonical,
    check_lam,
    check_share,
    check_variant,
)


def build_press(setting: Setting, marks: Marks = Marks(), keep_only_whitelist: bool = False) -> RecordingPress:
    """A recording press for ``setting`` (a policy's key, variant, lam and ratio); fair variants need the ``marks``'
    spans, whitelist ones their protected positions (both in token positions of the prefix)."""
    marks.require(setting)
    return RecordingPress(make_press(setting.policy, setting.ratio), setting, marks, keep_only_whitelist)


from fairkv.core.presses.native import (  # noqa: E402 (native needs the above)
    BoundaryPress,
    FairPress,
    NativePressError,
    WhitelistPress,
)
from fairkv.core.presses import rates  # noqa: E402
from fairkv.core.prompts import Span  # noqa: E402 (what keep_rates reads)


def keep_rates(kept: dict, spans, n_tokens: int) -> dict[str, float]:
    """Keep rate per span from recorded kept positions (``rates.keep_rates``), for a library user: at least one span,
    each a ``Span`` over a non-empty range of token positions inside the prefix of ``n_tokens``, and every kept
    position inside it, else an error names it (not a clipped rate, a NaN or torch's index error)."""
    if not spans:
        raise SpanError("no spans to read keep rates of: give fairkv.Span(name, start, end, text) for each")
    for span in spans:
        if not isinstance(span, Span):
            raise SpanError(f"{span!r} is no span: give fairkv.Span(name, start, end, text) (token positions)")
        if not 0 <= span.start < span.end <= n_tokens:
            raise SpanError(
                f"span {span.name!r} covers tokens [{span.start}, {span.end}): give a non-empty range inside the "
                f"prefix of {n_tokens} tokens"
            )
    if not isinstance(kept, dict) or not all(isinstance(i, torch.Tensor) and i.dim() == 3 for i in kept.values()):
        raise SpanError(
            f"kept is {type(kept).__name__}: give a dict of layer -> kept positions (batch, kv_heads, n_kept), as a "
            "press records them (press.kept), e.g. {0: indices} for one layer"
        )
    given = [indices for indices in kept.values() if indices.numel()]
    low, high = min((int(i.min()) for i in given), default=0), max((int(i.max()) for i in given), default=-1)
    if low < 0 or high >= n_tokens:
        raise SpanError(f"kept positions {low} to {high} lie outside the prefix's tokens 0 to {n_tokens - 1}")
    return rates.keep_rates(kept, spans, n_tokens)


__all__ = [
    "BoundaryPress",
    "FairPress",
    "NativePressError",
    "WhitelistPress",
    "keep_rates",
    "Span",
    "PAPER",
    "REGISTRY",
    "MITIGATIONS",
    "VARIANTS",
    "BudgetError",
    "Policy",
    "PolicyError",
    "Marks",
    "RecordingPress",
    "Setting",
    "SpanError",
    "Variant",
    "VariantError",
    "WhitelistError",
    "build_press",
    "canonical",
    "check_lam",
    "check_share",
    "BOUNDARY_SHARE",
    "check_ratio",
    "check_variant",
    "get_policy",
    "make_press",
]
