"""The one registry of policies: every press fairkv runs is one ``Policy`` (the paper's five with the paper's
settings, kvpress's other presses, a press of one's own), carrying how it is built, its settings, its backend, its
scoring kind and its span-local score for fair eviction; nothing outside it branches on a policy's name or class.

The paper: "We follow the implementation of each as given by KVPress". Settings follow the authors' code:
StreamingLLM keeps 4 sink tokens; SnapKV uses a 16-token observation window and pooling kernel 5 (kvpress's default
window is 64); H2O is kvpress's ObservedAttentionPress and needs eager attention.

Beyond the paper, ``REGISTRY`` and ``NOT_RUN`` together name every press kvpress exports (a test keeps them complete
when kvpress adds one): each policy with its **backend**, each press not run with the reason (weights or statistics
from the Hugging Face hub, compression while decoding rather than of the prefill, a prefill of its own, no eviction
of tokens at all):

- ``SCORE_ONCE`` (``fairkv.core.score_once``): a ``ScorerPress`` whose score does not read the ratio and draws no random
  numbers, scored once per prompt and cut at every (variant, ratio): the paper's five and most other scorers;
- ``PER_SETTING`` (``fairkv.core.per_setting``): the press's own ``compress`` run at each (variant, ratio): kvpress's
  wrappers (AdaKV keeps a different number of tokens per head, CriticalKV's score reads the ratio, Block scores block by
  block) and the scorers that draw a sketch at every call.

Wrappers wrap SnapKV with the paper's settings, so their rows read as "what the wrapper changes in SnapKV". Grids, the
engine, the atlas and the audit take a policy by its key (``get_policy``); a press of one's own (fairkv's or a
user's) joins the registry at run time through ``fairkv.core.presses.own.register``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import kvpress
import torch
from kvpress import (
    BasePress,
    KnormPress,
    ObservedAttentionPress,
    ScorerPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)

from fairkv.core.presses import scoring

SNAPKV_WINDOW = 16
STREAMING_SINKS = 4
SCORE_ONCE = "score once"
PER_SETTING = "compress per setting"


class PolicyError(ValueError):
    """Unknown policy or press, a press that cannot run here, or an invalid compression ratio."""


# a span-local scorer (Appendix F): (press, module, hidden_states, keys, values, attentions, kwargs, spans) -> scores
LocalScorer = Callable[..., torch.Tensor]
# fair eviction's span-local scores of a scorer without a rule of its own, by how its score reads tokens
KIND_SCORERS: dict[str, LocalScorer] = {
    "independent": scoring.independent_scores,
    "cross-token": scoring.span_as_prompt,
}


@dataclass(frozen=True)
class Policy:
    """One policy, everything about it in one place: a press fairkv runs (the paper's five, kvpress's other presses,
    a press of one's own), its ``key`` (grids, the engine and the audit take it), ``label`` (rows and figures show it),
    the press class ``cls`` and ``build`` (the press at a ratio), its ``backend`` and the rule fair eviction scores
    each span by.

    ``scoring`` says whether the press's score of a token reads other tokens ("cross-token": queries, keys or values
    of other positions), only the token itself ("independent"), or is a wrapper's ("wrapper of <inner>"); ``local``
    is Appendix F's span-local score where the paper gives the policy one, else the kind's (``KIND_SCORERS``);
    ``rank`` a ranking other than the press's own score and ``reserved`` positions kept whatever the budget
    (StreamingLLM's). ``attentions``: the press reads the prefill's attention weights (the atlas's collector passes
    them; kvpress's chunked wrappers refuse them, SnapKV computes its window's own when they are absent).
    ``ratio_free``: a ScorerPress whose score does not read the ratio (scored once, cut at every ratio); ``source``:
    a press of one's own's source hash (``presses.own``), held by its cells' ids."""

    key: str
    label: str  # the paper's name for its five
    cls: type
    build: Callable[[float], BasePress]
    scoring: str
    backend: str = SCORE_ONCE
    local: LocalScorer | None = None
    rank: Callable[[BasePress, torch.Tensor], torch.Tensor] | None = None
    reserved: Callable[[BasePress, int], tuple[int, ...]] | None = None
    min_tokens: int = SNAPKV_WINDOW  # the press needs a prefix longer than this
    needs_eager: bool = False
    attentions: bool = False
    paper: bool = False
    ratio_free: bool = False
    source: str = ""

    @property
    def name(self) -> str:
        """The press's class name, as kvpress lists it."""
        return self.cls.__name__

    def ranking_scores(  # 7 parameters: the press and kvpress's score arguments
        self, press, module, hidden_states, keys, values, attentions, kwargs
    ) -> torch.Tensor:
        """The policy's ranking (batch, kv_heads, n): the press's own score, or ``rank``."""
        if self.rank is not None:
            return self.rank(press, keys)
        return press.score(module, hidden_states, keys, values, attentions, kwargs)

    def local_scores(  # 8 parameters: the press, kvpress's score arguments and the spans
        self, press, module, hidden_states, keys, values, attentions, kwargs, spans
    ) -> torch.Tensor:
        """Appendix F's span-local scores (batch, kv_heads, n) for the given token spans."""
        scorer = self.local or (KIND_SCORERS.get(self.scoring) if self.backend == SCORE_ONCE else None)
        if scorer is None:
            raise PolicyError(
                f"no span-local scoring for {self.label} (scoring {self.scoring!r}, {self.backend}): a press of one's "
                "own declares its scoring when registered (fairkv.core.presses.own.register)"
            )
        return scorer(press, module, hidden_states, keys, values, attentions, kwargs, spans)

    def reserved_positions(self, press, n: int) -> tuple[int, ...]:
        """Positions kept whatever the budget, outside fair eviction's split (Appendix F.3: StreamingLLM's sinks)."""
        return self.reserved(press, n) if self.reserved is not None else ()


def _snapkv(ratio: float = 0.0) -> ScorerPress:
    return SnapKVPress(compression_ratio=ratio, window_size=SNAPKV_WINDOW, kernel_size=5)


def _sinks(press: StreamingLLMPress, n: int) -> tuple[int, ...]:
    return tuple(range(min(press.n_sink, n)))


# the paper's five (Section 4), with the paper's settings and Appendix F's span-local scores
PAPER_POLICIES = (
    Policy(
        "streamingllm",
        "StreamingLLM",
        StreamingLLMPress,
        lambda r: StreamingLLMPress(compression_ratio=r, n_sink=STREAMING_SINKS),
        "independent",
        local=lambda press, module, hidden, keys, values, attn, kwargs, spans: scoring.streaming_scores(press, keys),
        rank=scoring.streaming_scores,
        reserved=_sinks,
        min_tokens=STREAMING_SINKS,
        attentions=True,
        paper=True,
    ),
    Policy(
        "h2o",
        "H2O",
        ObservedAttentionPress,
        lambda r: ObservedAttentionPress(compression_ratio=r),
        "cross-token",
        local=lambda press, module, hidden, keys, values, attn, kwargs, spans: scoring.h2o_local(keys, attn, spans),
        min_tokens=0,
        needs_eager=True,
        attentions=True,
        paper=True,
        ratio_free=True,
    ),
    Policy(
        "snapkv",
        "SnapKV",
        SnapKVPress,
        _snapkv,
        "cross-token",
        local=lambda press, module, hidden, keys, values, attn, kwargs, spans: scoring.snapkv_local(
            press, keys, attn, spans
        ),
        attentions=True,
        paper=True,
        ratio_free=True,
    ),
    Policy(
        "tova",
        "TOVA",
        TOVAPress,
        lambda r: TOVAPress(compression_ratio=r),
        "cross-token",
        local=lambda press, module, hidden, keys, values, attn, kwargs, spans: scoring.tova_local(keys, attn, spans),
        min_tokens=1,
        attentions=True,
        paper=True,
        ratio_free=True,
    ),
    Policy(
        "knorm",
        "K-Norm",
        KnormPress,
        lambda r: KnormPress(compression_ratio=r),
        "independent",
        local=scoring.knorm_local,
        min_tokens=0,
        attentions=True,
        paper=True,
        ratio_free=True,
    ),
)


def _scorer(name: str, label: str, scoring_kind: str, ratio_free: bool = True, backend: str = SCORE_ONCE) -> Policy:
    """A kvpress ``ScorerPress`` at its defaults; ``backend`` PER_SETTING where its score reads the ratio or draws
    random numbers at every call (a sketch the score-once backend would draw once for all settings)."""
    cls = getattr(kvpress, name)
    return Policy(label.lower(), label, cls, lambda r: cls(r), scoring_kind, backend, ratio_free=ratio_free)


def _wrapper(name: str, label: str, build: Callable[[float], BasePress]) -> Policy:
    """A kvpress wrapper around SnapKV with the paper's settings (CriticalKV's stages read the ratio: per setting)."""
    return Policy(label.lower(), label, getattr(kvpress, name), build, "wrapper of SnapKV", PER_SETTING)


# kvpress's other presses fairkv runs: scorers at kvpress's defaults, then wrappers of SnapKV
OTHER_POLICIES = (
    _scorer("ExpectedAttentionPress", "ExpectedAttention", "cross-token"),
    _scorer("KeyDiffPress", "KeyDiff", "cross-token"),
    _scorer("LagKVPress", "LagKV", "cross-token"),
    _scorer("CURPress", "CUR", "cross-token"),
    # a random sketch drawn at every call; Compactor's also blends its two scores by the ratio
    _scorer("LeverageScorePress", "LeverageScore", "cross-token", backend=PER_SETTING),
    _scorer("CompactorPress", "Compactor", "cross-token", ratio_free=False, backend=PER_SETTING),
    _scorer("CapPress", "CAP", "cross-token"),
    _scorer("NonCausalAttnPress", "NonCausalAttn", "cross-token"),
    _scorer("RandomPress", "Random", "independent", backend=PER_SETTING),  # the control
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
)

# the one registry: every policy by its key (a press of one's own joins it through ``presses.own.register``)
REGISTRY: dict[str, Policy] = {policy.key: policy for policy in (*PAPER_POLICIES, *OTHER_POLICIES)}
PAPER = tuple(policy.key for policy in PAPER_POLICIES)  # the paper's five, in its order

HUB = "needs weights or statistics from the Hugging Face hub (offline here)"
DECODING = "compresses while decoding, not the prefill the paper's pitfall is about"
# kvpress's presses fairkv does not run, each with the reason (the atlas lists them)
NOT_RUN: dict[str, str] = {
    "KeyRerotationPress": (
        "keeps exactly its inner press's tokens and re-rotates their keys: its kept set is the inner press's row"
    ),
    "MergingPress": (
        "keeps exactly its inner press's tokens and folds the evicted values into them: its "
        "kept set is the inner press's row"
    ),
    "PerLayerCompressionPress": (
        "sets a ratio per layer for an inner press: at one ratio for all layers "
        "it is the inner press (PyramidKV is the atlas's per-layer budget)"
    ),
    "ComposedPress": "chains presses one after another: each is measured on its own",
    "SimLayerKVPress": (
        "has no compression ratio: lazy layers keep the first 4 and the last 1024 tokens, "
        "which is every token of a prompt here"
    ),
    "ThinKPress": "prunes key channels, not tokens: no token is evicted",
    "FinchPress": (
        "needs a question after a delimiter token in the prefill; the paper's prefill is the system prompt alone"
    ),
    "KVzipPress": (
        "scores by re-reading the context in extra forward passes (not the one prefill the "
        "atlas scores), with a chunked prefill of its own"
    ),
    "KVgradPress": "a KVzip variant: extra forward and backward passes over the context",
    "RestoreKVPress": "a KVzip variant: extra forward passes over the context",
    "FastKVzipPress": f"{HUB} (trained gates), and a CUDA kernel",
    "KVzapPress": f"{HUB} (a trained scorer)",
    "DMSPress": f"{HUB} (a model trained for dynamic memory sparsification)",
    "DuoAttentionPress": f"{HUB} (attention patterns per head)",
    "QFilterPress": f"{HUB} (learned query filters)",
    "ExpectedAttentionStatsPress": f"{HUB} (query statistics per model)",
    "LUKVPress": (
        "allocates budgets from a pre-computed curve per model, which kvpress ships for other "
        "models than the embedded ones"
    ),
    "KVComposePress": (
        "aligns one composite token set across heads (structured), so its kept count is "
        "not the ratio's per head; not measured yet"
    ),
    "DecodingPress": DECODING,
    "CAMPress": DECODING,
    "CompressionRatioDecodingPress": DECODING,
    "PrefillDecodingPress": "pairs a prefill press with a decoding press: its prefill part is a press of the atlas",
    "BasePress": "abstract base class",
    "ScorerPress": "abstract base class",
}


def kvpress_presses() -> list[str]:
    """Every press kvpress exports (the names the registry and ``NOT_RUN`` must cover)."""
    return sorted(name for name in dir(kvpress) if name.endswith("Press") and isinstance(getattr(kvpress, name), type))


def runnable(names=None) -> list[Policy]:
    """The policies fairkv runs (``names``: kvpress class names, labels or keys; default every one); a name the
    registry lacks, or a press it does not run, is an error giving the reason."""
    if names is None:
        return list(REGISTRY.values())
    chosen = []
    for name in names:
        found = [p for p in REGISTRY.values() if name in (p.name, p.label, p.key)]
        if name in NOT_RUN:
            raise PolicyError(f"{name} cannot run here: {NOT_RUN[name]}")
        if not found:
            known = ", ".join(p.name for p in REGISTRY.values())
            raise PolicyError(f"unknown press {name!r}: the registry names kvpress classes ({known})")
        chosen.append(found[0])
    return chosen


def provenance(policy: str | None) -> dict[str, str]:
    """What a cell's identity holds of its press beyond its key or label: a press of one's own's source hash
    (``presses.own``); nothing for kvpress's presses and the uncompressed cache (None), so their cell ids stay as
    they are."""
    for entry in REGISTRY.values():
        if entry.source and policy in (entry.key, entry.label):
            return {"press_source": entry.source}
    return {}


def policy_of(press: BasePress) -> Policy:
    """The policy whose press class ``press`` is (exactly, not a subclass): how a press a kvpress user built is
    ranked and scored span by span. A class the registry lacks ranks by its own score, keeps no position whatever
    the budget, and has no span-local score."""
    for policy in REGISTRY.values():
        if policy.cls is type(press):
            return policy
    name = type(press).__name__
    return Policy(name.lower(), name, type(press), type(press), "unregistered")


def check_ratio(ratio: float) -> float:
    """A compression ratio r = 1 - b/n must lie in [0, 1)."""
    if not 0.0 <= float(ratio) < 1.0:
        raise PolicyError(f"compression ratio {ratio} is outside [0, 1): r is the fraction of the prefix evicted")
    return float(ratio)


def get_policy(key: str) -> Policy:
    """A policy by its key (``REGISTRY``)."""
    if key not in REGISTRY:
        raise PolicyError(f"unknown policy {key!r}: use one of {', '.join(REGISTRY)}")
    return REGISTRY[key]


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
