"""A press of one's own (issue 54, item 4): a press written in fairkv, or a user's, in the registry beside kvpress's.

``register`` puts a kvpress ``ScorerPress`` (or any ``BasePress`` for the per-setting backend) in the one registry of
policies (``registry.REGISTRY``) as kvpress's own are declared in ``policies``: after it, the press is a policy like the
paper's five (by its key: the label in lower case), so grids, the engine, the atlas, the operative words and the audit
take it, and fair eviction's span-local scores (Appendix F) follow the scoring it declares: "independent" (a token's
own score, as K-Norm's) or "cross-token" (the span scored as if it were the whole prompt, the rule the registry
applies to every cross-token scorer, ``policy.KIND_SCORERS``). A score-once press must score without reading the
ratio or drawing random numbers (``policy``'s rule for ``SCORE_ONCE``); otherwise register it with
``backend=PER_SETTING``.

The fingerprint of fairkv's code (``fairkv.runs.fingerprint``) covers the package, not a user's module, so a
registered press carries a hash of its class's source (``source_hash``) and every cell id of its rows holds it
(``registry.provenance``): an edit of the press makes new cells and never mixes with the rows of the old one. Its rows'
press stamp (``fingerprint.press_stamp``) is that hash with the span-local scores of the kinds it may declare. The
registration lives in the process that made it: a Ray worker (``executor="ray"``) imports fairkv without it, so run a
press of one's own in this process (the default executor).

    from fairkv.core.presses.own import register
    register("EarliestPress", "Earliest", lambda r: EarliestPress(compression_ratio=r), "independent")
    # then: Grid(policies=("earliest",), ...), atlas.Plan(presses=("Earliest",)), audit.cells.run(..., ("earliest",))
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import replace
from typing import Callable

from kvpress import BasePress, ScorerPress

from fairkv.core.presses.policy import KIND_SCORERS, PER_SETTING, SCORE_ONCE, Policy, PolicyError
from fairkv.core.presses.registry import NOT_RUN, REGISTRY


def source_hash(press: BasePress, scoring_kind: str, backend: str) -> str:
    """A hash of what decides a registered press's rows: the source of its class and of every class it derives from
    outside kvpress and torch, its configuration (the dataclass fields ``build`` set, as its ``repr`` shows them), its
    scoring and its backend. An edit of any of them changes it."""
    mine = [c for c in type(press).__mro__ if c.__module__.split(".")[0] not in ("kvpress", "torch", "builtins", "abc")]
    try:
        sources = [inspect.getsource(c) for c in mine]
    except (OSError, TypeError) as error:  # a class typed in a notebook cell or a REPL has no source file
        raise PolicyError(
            f"the source of {type(press).__name__} cannot be read ({error}): define the press in a module (a .py file) "
            "and import it, so that its rows can be told from an edited press's"
        ) from None
    text = "\n".join([*sources, repr(press), scoring_kind, backend])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def register(
    name: str,
    label: str,
    build: Callable[[float], BasePress],
    scoring_kind: str,
    backend: str = SCORE_ONCE,
) -> Policy:
    """Put the press ``build(r)`` makes in the registry as ``name`` (its class name, as kvpress's are listed) with the
    ``label`` its rows and figures show; ``scoring_kind`` "independent" or "cross-token" (fair eviction's span-local
    scores follow it). Returns its policy; a name or key the registry holds is an error."""
    if scoring_kind not in KIND_SCORERS:
        raise PolicyError(f"unknown scoring {scoring_kind!r}: use one of {', '.join(KIND_SCORERS)}")
    if backend not in (SCORE_ONCE, PER_SETTING):
        raise PolicyError(f"unknown backend {backend!r}: use {SCORE_ONCE!r} or {PER_SETTING!r}")
    press = build(0.5)
    if not isinstance(press, BasePress):
        raise PolicyError(f"{name}: build(r) must return a kvpress press, got {type(press).__name__}")
    if backend == SCORE_ONCE and not isinstance(press, ScorerPress):
        raise PolicyError(f"{name} is no ScorerPress: only scorers are scored once; register it with {PER_SETTING!r}")
    local = KIND_SCORERS[scoring_kind] if backend == SCORE_ONCE else None
    policy = Policy(
        label.lower(), label, type(press), build, scoring_kind, backend, local, ratio_free=backend == SCORE_ONCE
    )
    held = {n for p in REGISTRY.values() for n in (p.name, p.label, p.key)} | set(NOT_RUN)
    taken = [n for n in (name, label, policy.key) if n in held]
    if taken:
        raise PolicyError(f"the registry already holds {taken[0]!r}: register a press under a name of its own")
    if type(press).__module__.split(".")[0] == "kvpress" or any(p.cls is type(press) for p in REGISTRY.values()):
        raise PolicyError(
            f"{name}: {type(press).__name__} is a class the registry already scores (kvpress's, or registered): "
            "subclass it, so that its rows and its span-local scores stay apart from the registry's own"
        )
    policy = replace(policy, source=source_hash(press, scoring_kind, backend))
    REGISTRY[policy.key] = policy
    return policy


__all__ = ["register", "source_hash"]
