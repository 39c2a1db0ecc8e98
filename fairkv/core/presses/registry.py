"""The one registry of policies: every press fairkv runs is one ``Policy`` (``fairkv.core.presses.policy``: the
paper's five with the paper's settings, kvpress's other presses, a press of one's own), declared once as a binding of
``fairkv.core.presses.policies`` (the unit of a press: its rows' fingerprint covers its binding alone); nothing
outside a policy branches on its name or class. This module looks policies up: by key (``get_policy``), by kvpress
class name, label or key (``runnable``), by a press's class (``policy_of``).

Beyond the paper, ``REGISTRY`` and ``NOT_RUN`` together name every press kvpress exports (a test keeps them complete
when kvpress adds one): each policy with its backend, each press not run with the reason (weights or statistics from
the Hugging Face hub, compression while decoding rather than of the prefill, a prefill of its own, no eviction of
tokens at all). Grids, the engine, the atlas and the audit take a policy by its key; a press of one's own (fairkv's or
a user's) joins the registry at run time through ``fairkv.core.presses.own.register``.
"""

from __future__ import annotations

import kvpress
from kvpress import BasePress

from fairkv.core.presses.policies import REGISTRY
from fairkv.core.presses.policy import Policy, PolicyError, check_ratio

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


UNREGISTERED = "unregistered"  # the scoring of a press class the registry lacks (``policy_of``)


def policy_of(press: BasePress) -> Policy:
    """The policy whose press class ``press`` is (exactly, not a subclass): how a press a kvpress user built is
    ranked and scored span by span. A class the registry lacks ranks by its own score, keeps no position whatever
    the budget, and has no span-local score."""
    for policy in REGISTRY.values():
        if policy.cls is type(press):
            return policy
    name = type(press).__name__
    return Policy(name.lower(), name, type(press), type(press), UNREGISTERED)


def get_policy(key: str) -> Policy:
    """A policy by its key (``REGISTRY``)."""
    if key not in REGISTRY:
        raise PolicyError(f"unknown policy {key!r}: use one of {', '.join(REGISTRY)}")
    return REGISTRY[key]


def make_press(key: str, ratio: float) -> BasePress:
    """The kvpress press of policy ``key`` at compression ratio ``ratio``."""
    return get_policy(key).build(check_ratio(ratio))
