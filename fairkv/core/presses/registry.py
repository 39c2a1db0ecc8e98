"""The press catalogue: every kvpress press, how fairkv runs it, and the paper's five as configured policies.

The paper: "We follow the implementation of each as given by KVPress". Settings follow the authors' code:
StreamingLLM keeps 4 sink tokens; SnapKV uses a 16-token observation window and pooling kernel 5 (kvpress's default
window is 64); H2O is kvpress's ObservedAttentionPress and needs eager attention.

Beyond the paper, ``CATALOG`` names every press kvpress exports (a test keeps it complete when kvpress adds one) with
its **backend**, or the reason it cannot run here (weights or statistics from the Hugging Face hub, compression while
decoding rather than of the prefill, a prefill of its own, no eviction of tokens at all):

- ``SCORE_ONCE`` (``fairkv.core.score_once``): a ``ScorerPress`` whose score does not read the ratio and draws no random
  numbers, scored once per prompt and cut at every (variant, ratio): the paper's five and most other scorers;
- ``PER_SETTING`` (``fairkv.core.per_setting``): the press's own ``compress`` run at each (variant, ratio): kvpress's
  wrappers (AdaKV keeps a different number of tokens per head, CriticalKV's score reads the ratio, Block scores block by
  block) and the scorers that draw a sketch at every call.

Wrappers wrap SnapKV with the paper's settings, so their rows read as "what the wrapper changes in SnapKV". Every
runnable press is a policy (``get_policy``) that grids, the engine and the audit take by its key, declared here once;
a press of one's own (fairkv's or a user's) joins them at run time through ``fairkv.core.presses.own.register``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import kvpress
from kvpress import (
    BasePress,
    KnormPress,
    ObservedAttentionPress,
    ScorerPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)

SNAPKV_WINDOW = 16
STREAMING_SINKS = 4
SCORE_ONCE = "score once"
PER_SETTING = "compress per setting"


class PolicyError(ValueError):
    """Unknown policy or press, a press that cannot run here, or an invalid compression ratio."""


@dataclass(frozen=True)
class Policy:
    key: str
    label: str  # the paper's name
    build: Callable[[float], BasePress]
    min_tokens: int  # the press needs a prefix longer than this
    needs_eager: bool = False
    backend: str = SCORE_ONCE


# the paper's five (Section 4)
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


@dataclass(frozen=True)
class Entry:
    """How fairkv runs one kvpress press (its ``backend``), or why it does not (``build`` None, ``reason`` given).

    ``scoring`` says whether the press's score of a token reads other tokens ("cross-token": queries, keys or values
    of other positions), only the token itself ("independent"), or is a wrapper's ("wrapper of <inner>"): fair
    eviction's span-local scores follow it (``fairkv.core.presses.scoring``). ``attentions``: the press reads the
    prefill's attention weights (the atlas's collector passes them; kvpress's chunked wrappers refuse them, SnapKV
    computes its window's own when they are absent)."""

    name: str
    label: str = ""
    build: Callable[[float], BasePress] | None = None
    scoring: str = ""
    reason: str = ""
    attentions: bool = False
    paper: bool = False
    ratio_free: bool = False  # a ScorerPress whose score does not read the ratio: scored once, cut at every ratio
    backend: str | None = None
    source: str = ""  # a press of one's own (``presses.own.register``): a hash of its source, held by its cells' ids

    @property
    def key(self) -> str:
        """The policy key: the paper's for its five, else the label in lower case ("keydiff", "adakv(snapkv)")."""
        return next((p.key for p in POLICIES.values() if p.label == self.label), self.label.lower())


def _snapkv(ratio: float = 0.0) -> ScorerPress:
    return make_press("snapkv", ratio)


def _paper(name: str, key: str, label: str, scoring: str, ratio_free: bool = True) -> Entry:
    build = lambda r: make_press(key, r)
    return Entry(name, label, build, scoring, attentions=True, paper=True, ratio_free=ratio_free, backend=SCORE_ONCE)


def _scorer(
    name: str,
    label: str,
    build: Callable[[float], ScorerPress],
    scoring: str,
    ratio_free: bool = True,
    backend: str = SCORE_ONCE,
) -> Entry:
    """A ``ScorerPress``; ``backend`` PER_SETTING where its score reads the ratio or draws random numbers at every
    call (a sketch the score-once backend would draw once for all settings)."""
    return Entry(name, label, build, scoring, ratio_free=ratio_free, backend=backend)


def _wrapper(name: str, label: str, build: Callable[[float], BasePress]) -> Entry:
    return Entry(name, label, build, "wrapper of SnapKV", backend=PER_SETTING)  # CriticalKV's stages read the ratio


HUB = "needs weights or statistics from the Hugging Face hub (offline here)"
DECODING = "compresses while decoding, not the prefill the paper's pitfall is about"
CATALOG: dict[str, Entry] = {
    e.name: e
    for e in (
        # the paper's five, with the paper's settings (fairkv.core.presses.registry)
        _paper("StreamingLLMPress", "streamingllm", "StreamingLLM", "independent", ratio_free=False),
        _paper("ObservedAttentionPress", "h2o", "H2O", "cross-token"),
        _paper("SnapKVPress", "snapkv", "SnapKV", "cross-token"),
        _paper("TOVAPress", "tova", "TOVA", "cross-token"),
        _paper("KnormPress", "knorm", "K-Norm", "independent"),
        # other scorers, kvpress's defaults (Compactor blends its two scores by the ratio)
        _scorer(
            "ExpectedAttentionPress", "ExpectedAttention", lambda r: kvpress.ExpectedAttentionPress(r), "cross-token"
        ),
        _scorer("KeyDiffPress", "KeyDiff", lambda r: kvpress.KeyDiffPress(r), "cross-token"),
        _scorer("LagKVPress", "LagKV", lambda r: kvpress.LagKVPress(r), "cross-token"),
        _scorer("CURPress", "CUR", lambda r: kvpress.CURPress(r), "cross-token"),
        # a random sketch drawn at every call; Compactor's also blends its two scores by the ratio
        _scorer(
            "LeverageScorePress",
            "LeverageScore",
            lambda r: kvpress.LeverageScorePress(r),
            "cross-token",
            backend=PER_SETTING,
        ),
        _scorer(
            "CompactorPress",
            "Compactor",
            lambda r: kvpress.CompactorPress(r),
            "cross-token",
            ratio_free=False,
            backend=PER_SETTING,
        ),
        _scorer("CapPress", "CAP", lambda r: kvpress.CapPress(r), "cross-token"),
        _scorer("NonCausalAttnPress", "NonCausalAttn", lambda r: kvpress.NonCausalAttnPress(r), "cross-token"),
        # the control
        _scorer("RandomPress", "Random", lambda r: kvpress.RandomPress(r), "independent", backend=PER_SETTING),
        # wrappers, around SnapKV with the paper's settings
        _wrapper("AdaKVPress", "AdaKV(SnapKV)", lambda r: kvpress.AdaKVPress(_snapkv(r))),
        _wrapper("CriticalKVPress", "CriticalKV(SnapKV)", lambda r: kvpress.CriticalKVPress(_snapkv(r))),
        _wrapper("CriticalAdaKVPress", "CriticalAdaKV(SnapKV)", lambda r: kvpress.CriticalAdaKVPress(_snapkv(r))),
        _wrapper(
            "PyramidKVPress", "PyramidKV", lambda r: kvpress.PyramidKVPress(r, window_size=SNAPKV_WINDOW, kernel_size=5)
        ),
        _wrapper("ChunkKVPress", "ChunkKV(SnapKV)", lambda r: kvpress.ChunkKVPress(_snapkv(r))),
        _wrapper(
            "EntropyGatedChunkKVPress",
            "EntropyGatedChunkKV(SnapKV)",
            lambda r: kvpress.EntropyGatedChunkKVPress(_snapkv(r)),
        ),
        # kvpress's default chunk (1024 tokens) is longer than every prompt here, where ChunkPress is SnapKV itself
        _wrapper("ChunkPress", "Chunk64(SnapKV)", lambda r: kvpress.ChunkPress(_snapkv(r), chunk_length=64)),
        _wrapper("BlockPress", "Block64(SnapKV)", lambda r: kvpress.BlockPress(_snapkv(r), block_size=64)),
        # not in the atlas, with the reason
        Entry(
            "KeyRerotationPress",
            reason="keeps exactly its inner press's tokens and re-rotates their keys: its kept set "
            "is the inner press's row",
        ),
        Entry(
            "MergingPress",
            reason="keeps exactly its inner press's tokens and folds the evicted values into them: its "
            "kept set is the inner press's row",
        ),
        Entry(
            "PerLayerCompressionPress",
            reason="sets a ratio per layer for an inner press: at one ratio for all layers "
            "it is the inner press (PyramidKV is the atlas's per-layer budget)",
        ),
        Entry("ComposedPress", reason="chains presses one after another: each is measured on its own"),
        Entry(
            "SimLayerKVPress",
            reason="has no compression ratio: lazy layers keep the first 4 and the last 1024 tokens, "
            "which is every token of a prompt here",
        ),
        Entry("ThinKPress", reason="prunes key channels, not tokens: no token is evicted"),
        Entry(
            "FinchPress",
            reason="needs a question after a delimiter token in the prefill; the paper's prefill is the "
            "system prompt alone",
        ),
        Entry(
            "KVzipPress",
            reason="scores by re-reading the context in extra forward passes (not the one prefill the "
            "atlas scores), with a chunked prefill of its own",
        ),
        Entry("KVgradPress", reason="a KVzip variant: extra forward and backward passes over the context"),
        Entry("RestoreKVPress", reason="a KVzip variant: extra forward passes over the context"),
        Entry("FastKVzipPress", reason=f"{HUB} (trained gates), and a CUDA kernel"),
        Entry("KVzapPress", reason=f"{HUB} (a trained scorer)"),
        Entry("DMSPress", reason=f"{HUB} (a model trained for dynamic memory sparsification)"),
        Entry("DuoAttentionPress", reason=f"{HUB} (attention patterns per head)"),
        Entry("QFilterPress", reason=f"{HUB} (learned query filters)"),
        Entry("ExpectedAttentionStatsPress", reason=f"{HUB} (query statistics per model)"),
        Entry(
            "LUKVPress",
            reason="allocates budgets from a pre-computed curve per model, which kvpress ships for other "
            "models than the embedded ones",
        ),
        Entry(
            "KVComposePress",
            reason="aligns one composite token set across heads (structured), so its kept count is "
            "not the ratio's per head; not measured yet",
        ),
        Entry("DecodingPress", reason=DECODING),
        Entry("CAMPress", reason=DECODING),
        Entry("CompressionRatioDecodingPress", reason=DECODING),
        Entry(
            "PrefillDecodingPress",
            reason="pairs a prefill press with a decoding press: its prefill part is a press of the atlas",
        ),
        Entry("BasePress", reason="abstract base class"),
        Entry("ScorerPress", reason="abstract base class"),
    )
}


def kvpress_presses() -> list[str]:
    """Every press kvpress exports (the names the catalog must cover)."""
    return sorted(name for name in dir(kvpress) if name.endswith("Press") and isinstance(getattr(kvpress, name), type))


def runnable(names=None) -> list[Entry]:
    """The catalog entries fairkv runs (``names``: kvpress class names or labels; default every runnable one);
    a name the catalog lacks or cannot run is an error giving the reason."""
    if names is None:
        return [e for e in CATALOG.values() if e.build is not None]
    by_label = {e.label: e for e in CATALOG.values() if e.label}
    chosen = []
    for name in names:
        entry = CATALOG.get(name) or by_label.get(name)
        if entry is None:
            raise PolicyError(f"unknown press {name!r}: the catalog names kvpress classes ({', '.join(CATALOG)})")
        if entry.build is None:
            raise PolicyError(f"{name} cannot run here: {entry.reason}")
        chosen.append(entry)
    return chosen


# every policy key a grid takes: the paper's five, then each other runnable press of the catalogue
PRESSES: dict[str, Policy] = {
    **POLICIES,
    **{
        e.key: Policy(e.key, e.label, e.build, min_tokens=SNAPKV_WINDOW, backend=e.backend)
        for e in runnable()
        if not e.paper
    },
}


def provenance(policy: str | None) -> dict[str, str]:
    """What a cell's identity holds of its press beyond its key or label: a press of one's own's source hash
    (``presses.own``); nothing for kvpress's presses and the uncompressed cache (None), so their cell ids stay as
    they are."""
    for entry in CATALOG.values():
        if entry.source and policy in (entry.key, entry.label):
            return {"press_source": entry.source}
    return {}


def entry_of(key: str) -> Entry:
    """The catalogue entry of a policy key."""
    for entry in runnable():
        if entry.key == key:
            return entry
    raise PolicyError(f"unknown policy {key!r}: use one of {', '.join(PRESSES)}")


def check_ratio(ratio: float) -> float:
    """A compression ratio r = 1 - b/n must lie in [0, 1)."""
    if not 0.0 <= float(ratio) < 1.0:
        raise PolicyError(f"compression ratio {ratio} is outside [0, 1): r is the fraction of the prefix evicted")
    return float(ratio)


def get_policy(key: str) -> Policy:
    """Any runnable press of the catalogue by its key (``PRESSES``)."""
    if key not in PRESSES:
        raise PolicyError(f"unknown policy {key!r}: use one of {', '.join(PRESSES)}")
    return PRESSES[key]


def make_press(key: str, ratio: float) -> BasePress:
    """The kvpress press of policy ``key`` at compression ratio ``ratio``."""
    return get_policy(key).build(check_ratio(ratio))


# Variants of a policy (Section 5): the base press, its whitelist, fair eviction (lam = 1, or a debiasing lam), both.
VARIANTS = ("base", "whitelist", "fair", "fair+whitelist")
MITIGATIONS = VARIANTS[:3]  # the base and each mitigation alone: what Appendix K times and the audit reports


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise PolicyError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    return variant
