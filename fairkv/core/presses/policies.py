"""Every policy fairkv runs, one binding each: the paper's five (Section 4) with the paper's settings and Appendix F's
span-local scores, then kvpress's other presses (scorers at kvpress's defaults, wrappers of SnapKV).

A binding is the unit of a press: adding one is one line here, and a row's fingerprint covers the binding of the
press it ran (``fairkv.runs.fingerprint.press_stamp``), not this module: ``REGISTRY`` is gathered from the module's
bindings without naming them, so adding a press keeps every other row's stamp, and editing one press's declaration
(or the scoring only it uses) moves only its rows'. The paper: "We follow the implementation of each as given by
KVPress"; settings follow the authors' code: StreamingLLM keeps 4 sink tokens; SnapKV uses a 16-token observation
window and pooling kernel 5 (kvpress's default window is 64); H2O is kvpress's ObservedAttentionPress and needs eager
attention. Wrappers wrap SnapKV with the paper's settings, so their rows read as "what the wrapper changes in SnapKV".
"""

from __future__ import annotations

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

from fairkv.core.presses import scoring
from fairkv.core.presses.policy import (
    PER_SETTING,
    SCORE_ONCE,
    SNAPKV_WINDOW,
    STREAMING_SINKS,
    LocalScorer,
    Policy,
)


def _paper(key: str, label: str, cls: type, build: Callable[[float], BasePress], **declared) -> Policy:
    """One of the paper's five: its press reads the prefill's attention weights, its span-local score is Appendix
    F's (``local``), and it is scored once; what differs between them is ``declared``."""
    return Policy(key, label, cls, build, attentions=True, paper=True, **declared)


def _by_attention(local: Callable) -> LocalScorer:
    """Appendix F's span-local score of a policy that reads the keys and the attention weights alone (H2O, TOVA)."""
    return lambda press, module, hidden, keys, values, attentions, kwargs, spans: local(keys, attentions, spans)


def _snapkv(ratio: float = 0.0) -> ScorerPress:
    return SnapKVPress(compression_ratio=ratio, window_size=SNAPKV_WINDOW, kernel_size=5)


def _sinks(press: StreamingLLMPress, n: int) -> tuple[int, ...]:
    return tuple(range(min(press.n_sink, n)))


STREAMINGLLM = _paper(
    "streamingllm",
    "StreamingLLM",
    StreamingLLMPress,
    lambda r: StreamingLLMPress(compression_ratio=r, n_sink=STREAMING_SINKS),
    scoring="independent",
    local=lambda press, module, hidden, keys, values, attentions, kwargs, spans: scoring.streaming_scores(press, keys),
    rank=scoring.streaming_scores,
    reserved=_sinks,
    min_tokens=STREAMING_SINKS,
)
H2O = _paper(
    "h2o",
    "H2O",
    ObservedAttentionPress,
    lambda r: ObservedAttentionPress(compression_ratio=r),
    scoring="cross-token",
    local=_by_attention(scoring.h2o_local),
    min_tokens=0,
    needs_eager=True,
    ratio_free=True,
)
SNAPKV = _paper(
    "snapkv",
    "SnapKV",
    SnapKVPress,
    _snapkv,
    scoring="cross-token",
    local=lambda press, module, hidden, keys, values, attentions, kwargs, spans: scoring.snapkv_local(
        press, keys, attentions, spans
    ),
    ratio_free=True,
)
TOVA = _paper(
    "tova",
    "TOVA",
    TOVAPress,
    lambda r: TOVAPress(compression_ratio=r),
    scoring="cross-token",
    local=_by_attention(scoring.tova_local),
    min_tokens=1,
    ratio_free=True,
)
KNORM = _paper(
    "knorm",
    "K-Norm",
    KnormPress,
    lambda r: KnormPress(compression_ratio=r),
    scoring="independent",
    local=scoring.knorm_local,
    min_tokens=0,
    ratio_free=True,
)


def _scorer(  # 6 parameters: a scorer's names, its kind with the kind's span-local score, and its backend
    name: str, label: str, scoring_kind: str, local: LocalScorer, ratio_free: bool = True, backend: str = SCORE_ONCE
) -> Policy:
    """A kvpress ``ScorerPress`` at its defaults, its span-local score its kind's (``local``) when scored once;
    ``backend`` PER_SETTING where its score reads the ratio or draws random numbers at every call (a sketch the
    score-once backend would draw once for all settings)."""
    cls = getattr(kvpress, name)
    local = local if backend == SCORE_ONCE else None
    return Policy(label.lower(), label, cls, lambda r: cls(r), scoring_kind, backend, local, ratio_free=ratio_free)


def _cross_token(name: str, label: str, **declared) -> Policy:
    """A scorer whose score of a token reads other tokens: each span scored as a prompt of its own."""
    return _scorer(name, label, "cross-token", scoring.span_as_prompt, **declared)


def _independent(name: str, label: str, **declared) -> Policy:
    """A scorer whose score of a token reads that token alone: its own score is already span-local."""
    return _scorer(name, label, "independent", scoring.independent_scores, **declared)


def _wrapper(name: str, label: str, build: Callable[[float], BasePress]) -> Policy:
    """A kvpress wrapper around SnapKV with the paper's settings (CriticalKV's stages read the ratio: per setting)."""
    return Policy(label.lower(), label, getattr(kvpress, name), build, "wrapper of SnapKV", PER_SETTING)


EXPECTED_ATTENTION = _cross_token("ExpectedAttentionPress", "ExpectedAttention")
KEYDIFF = _cross_token("KeyDiffPress", "KeyDiff")
LAGKV = _cross_token("LagKVPress", "LagKV")
CUR = _cross_token("CURPress", "CUR")
# a random sketch drawn at every call; Compactor's also blends its two scores by the ratio
LEVERAGE_SCORE = _cross_token("LeverageScorePress", "LeverageScore", backend=PER_SETTING)
COMPACTOR = _cross_token("CompactorPress", "Compactor", ratio_free=False, backend=PER_SETTING)
CAP = _cross_token("CapPress", "CAP")
NON_CAUSAL_ATTN = _cross_token("NonCausalAttnPress", "NonCausalAttn")
RANDOM = _independent("RandomPress", "Random", backend=PER_SETTING)  # the control
ADAKV = _wrapper("AdaKVPress", "AdaKV(SnapKV)", lambda r: kvpress.AdaKVPress(_snapkv(r)))
CRITICALKV = _wrapper("CriticalKVPress", "CriticalKV(SnapKV)", lambda r: kvpress.CriticalKVPress(_snapkv(r)))
CRITICAL_ADAKV = _wrapper(
    "CriticalAdaKVPress", "CriticalAdaKV(SnapKV)", lambda r: kvpress.CriticalAdaKVPress(_snapkv(r))
)
PYRAMIDKV = _wrapper(
    "PyramidKVPress", "PyramidKV", lambda r: kvpress.PyramidKVPress(r, window_size=SNAPKV_WINDOW, kernel_size=5)
)
CHUNKKV = _wrapper("ChunkKVPress", "ChunkKV(SnapKV)", lambda r: kvpress.ChunkKVPress(_snapkv(r)))
ENTROPY_GATED_CHUNKKV = _wrapper(
    "EntropyGatedChunkKVPress", "EntropyGatedChunkKV(SnapKV)", lambda r: kvpress.EntropyGatedChunkKVPress(_snapkv(r))
)
# kvpress's default chunk (1024 tokens) is longer than every prompt here, where ChunkPress is SnapKV itself
CHUNK = _wrapper("ChunkPress", "Chunk64(SnapKV)", lambda r: kvpress.ChunkPress(_snapkv(r), chunk_length=64))
BLOCK = _wrapper("BlockPress", "Block64(SnapKV)", lambda r: kvpress.BlockPress(_snapkv(r), block_size=64))

# the one registry: every binding above by its key, in their order (gathered, not named, so that no row's
# fingerprint reaches every declaration); a press of one's own joins it through ``presses.own.register``
BINDINGS: dict[str, str] = {value.key: name for name, value in dict(globals()).items() if isinstance(value, Policy)}
REGISTRY: dict[str, Policy] = {key: globals()[name] for key, name in BINDINGS.items()}
PAPER = tuple(key for key, policy in REGISTRY.items() if policy.paper)  # the paper's five, in its order
