"""The five eviction policies of the paper, as configured kvpress presses.

The paper: "We follow the implementation of each as given by KVPress". Settings follow the authors' code:
StreamingLLM keeps 4 sink tokens; SnapKV uses a 16-token observation window and pooling kernel 5 (kvpress's default
window is 64); H2O is kvpress's ObservedAttentionPress and needs eager attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvpress import KnormPress, ObservedAttentionPress, ScorerPress, SnapKVPress, StreamingLLMPress, TOVAPress

SNAPKV_WINDOW = 16
STREAMING_SINKS = 4


class PolicyError(ValueError):
    """Unknown policy or invalid compression ratio."""


@dataclass(frozen=True)
class Policy:
    key: str
    label: str  # the paper's name
    build: Callable[[float], ScorerPress]
    min_tokens: int  # the press needs a prefix longer than this
    needs_eager: bool = False


POLICIES: dict[str, Policy] = {
    "streamingllm": Policy(
        "streamingllm",
        "StreamingLLM",
        lambda r: StreamingLLMPress(compression_ratio=r, n_sink=STREAMING_SINKS),
        min_tokens=STREAMING_SINKS,
    ),
    "h2o": Policy("h2o", "H2O", lambda r: ObservedAttentionPress(compression_ratio=r), min_tokens=0, needs_eager=True),
    "snapkv": Policy(
        "snapkv",
        "SnapKV",
        lambda r: SnapKVPress(compression_ratio=r, window_size=SNAPKV_WINDOW, kernel_size=5),
        min_tokens=SNAPKV_WINDOW,
    ),
    "tova": Policy("tova", "TOVA", lambda r: TOVAPress(compression_ratio=r), min_tokens=1),
    "knorm": Policy("knorm", "K-Norm", lambda r: KnormPress(compression_ratio=r), min_tokens=0),
}


def check_ratio(ratio: float) -> float:
    """A compression ratio r = 1 - b/n must lie in [0, 1)."""
    if not 0.0 <= float(ratio) < 1.0:
        raise PolicyError(f"compression ratio {ratio} is outside [0, 1): r is the fraction of the prefix evicted")
    return float(ratio)


def get_policy(key: str) -> Policy:
    if key not in POLICIES:
        raise PolicyError(f"unknown policy {key!r}: use one of {', '.join(POLICIES)}")
    return POLICIES[key]


def make_press(key: str, ratio: float) -> ScorerPress:
    """The kvpress press of policy ``key`` at compression ratio ``ratio``."""
    return get_policy(key).build(check_ratio(ratio))


# Variants of a policy (Section 5): the base press, its whitelist, fair eviction (lam = 1, or a debiasing lam), both.
VARIANTS = ("base", "whitelist", "fair", "fair+whitelist")
MITIGATIONS = VARIANTS[:3]  # the base and each mitigation alone: what Appendix K times and the audit reports


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise PolicyError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    return variant
