"""Eviction policies (kvpress presses with the paper's settings), their mitigations, and the kept-index recorder.

``build_press`` is the engine's entry point: policy key x variant (base, whitelist, fair, fair+whitelist) x ratio x
lam, spans and whitelist in token positions. ``WhitelistPress`` and ``FairPress`` are the same mitigations as kvpress
presses taking text (``native``), and ``keep_rates`` reads keep rates per span (``rates``): with this package, the
core a kvpress user installs alone (torch, transformers, kvpress), exported at ``fairkv``'s top.
"""

from __future__ import annotations

from typing import Sequence

from fairkv.core.presses.budget import BudgetError
from fairkv.core.presses.recording import RecordingPress
from fairkv.core.presses.registry import (
    MITIGATIONS,
    PAPER,
    REGISTRY,
    VARIANTS,
    Policy,
    PolicyError,
    check_ratio,
    check_variant,
    get_policy,
    make_press,
)
from fairkv.core.presses.selection import SpanError, WhitelistError, check_variant_inputs


def build_press(  # 7 parameters: a setting's fields and the prompt's spans
    policy: str,
    ratio: float,
    variant: str = "base",
    spans: Sequence[tuple[int, int]] = (),
    protected: Sequence[int] = (),
    lam: float = 1.0,
    keep_only_whitelist: bool = False,
) -> RecordingPress:
    """A recording press for ``policy`` at ``ratio`` in ``variant``; fair variants need ``spans``, whitelist ones
    ``protected`` (both in token positions of the prefix)."""
    check_variant_inputs(variant, spans, protected)
    return RecordingPress(make_press(policy, ratio), variant, tuple(spans), tuple(protected), lam, keep_only_whitelist)


from fairkv.core.presses.native import FairPress, NativePressError, WhitelistPress  # noqa: E402 (native needs the above)
from fairkv.core.presses.rates import keep_rates  # noqa: E402

__all__ = [
    "FairPress",
    "NativePressError",
    "WhitelistPress",
    "keep_rates",
    "PAPER",
    "REGISTRY",
    "MITIGATIONS",
    "VARIANTS",
    "BudgetError",
    "Policy",
    "PolicyError",
    "RecordingPress",
    "SpanError",
    "WhitelistError",
    "build_press",
    "check_variant_inputs",
    "check_ratio",
    "check_variant",
    "get_policy",
    "make_press",
]
