"""Whitelist and fair eviction for any kvpress ``ScorerPress`` (beyond the paper).

The whitelist (Section 5.1) and the per-span budgets of fair eviction (Algorithm 1, Appendix G) read nothing of a
press but its scores, so ``presses.selection.choose`` applies them to any ``ScorerPress``. What fair eviction also
needs is span-local scores (Appendix F: "one span's queries never score another span's keys"). The paper adapts its
five policies one by one (``presses.scoring``); for the other presses ``LOCALITY`` (from ``atlas.CATALOG``'s
``scoring`` column, the one table of which case each press is) decides:

- "independent" (a token's score reads only that token: K-Norm, Random): the press's own score is already local;
- "cross-token" (the score reads other tokens' queries, keys or values): each span is scored as a prompt of its own
  (``span_as_prompt``): the press's ``score`` sees only the span's hidden states, keys and values, with the keys
  re-rotated to start at position 0 and the RoPE tables of positions 0 .. len - 1, exactly what it would see if the
  span were the whole prefix. Whatever a press does at the start of a prefix (the 4 sinks of ExpectedAttention, LagKV
  and CUR) it does at each span's start.

``register`` adds these presses to the policies the engine, the sweeps and the audit know (``presses.POLICIES``) and
their local scorer to ``presses.scoring.LOCAL_SCORERS``, at run time: the paper's modules stay untouched, so the
paper's rows keep their fingerprint, and a process that registers extends the fingerprint of every row it computes
with the definitions ``register`` reaches (``fingerprint.extend``): its rows never mix with the paper's.
Registered are the presses whose score is deterministic and does not read the ratio (the engine scores once and cuts
every ratio from it): not LeverageScore and Compactor (a random sketch drawn at every call), not Compactor and
CriticalKV (their scores read the ratio). They still take the variants through ``presses.RecordingPress``, which
scores at its own ratio.
"""

from __future__ import annotations

import torch
from kvpress import ScorerPress

from fairkv.core.presses import registry, scoring
from fairkv.runs import atlas, fingerprint

LOCALITY = {
    entry.name: entry.scoring for entry in atlas.CATALOG.values() if entry.build is not None and not entry.paper
}
NOT_SCORE_ONCE = {
    "LeverageScorePress": "draws a random sketch at every call",
    "CompactorPress": "draws a random sketch at every call and blends its two scores by the ratio",
    "CriticalKVPress": "its two-stage score reads the ratio",
    "RandomPress": "random by design (the atlas's control), no attack study needs it",
}


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


def span_as_prompt(press: ScorerPress, module, hidden_states, keys, values, attentions, kwargs, spans) -> torch.Tensor:
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


def _independent(press, module, hidden_states, keys, values, attentions, kwargs, spans) -> torch.Tensor:
    return press.score(module, hidden_states, keys, values, None, kwargs)


def local_scorer(name: str):
    """The span-local scorer of kvpress class ``name`` (its case in ``LOCALITY``)."""
    if name not in LOCALITY:
        raise atlas.AtlasError(
            f"{name} has no span-local scoring: the atlas runs {', '.join(LOCALITY)} beside the paper's five"
        )
    return _independent if LOCALITY[name] == "independent" else span_as_prompt


def key(entry: atlas.Entry) -> str:
    """The policy key of a registered press: its label in lower case ("keydiff", "expectedattention")."""
    return entry.label.lower()


def scorers() -> list[atlas.Entry]:
    """The catalog's presses that the score-once engine can take (ScorerPresses, deterministic, ratio-free)."""
    return [
        e
        for e in atlas.runnable()
        if not e.paper and e.ratio_free and e.name not in NOT_SCORE_ONCE and isinstance(e.build(0.5), ScorerPress)
    ]


def register(names=None) -> list[str]:
    """Make ``names`` (kvpress class names or labels; default every press of ``scorers``) policies of the engine, with
    their span-local scorer; return their keys. Extends the code fingerprint of every row this process computes."""
    chosen = scorers() if names is None else atlas.runnable(names)
    for entry in chosen:
        if entry not in scorers():
            raise atlas.AtlasError(
                f"{entry.name} cannot be scored once: "
                f"{NOT_SCORE_ONCE.get(entry.name, 'not a ratio-free ScorerPress of the atlas')}"
            )
        registry.POLICIES[key(entry)] = registry.Policy(key(entry), entry.label, entry.build, min_tokens=16)
        scoring.LOCAL_SCORERS[type(entry.build(0.5))] = local_scorer(entry.name)
    fingerprint.extend(fingerprint.ANYPRESS)
    return [key(e) for e in chosen]
