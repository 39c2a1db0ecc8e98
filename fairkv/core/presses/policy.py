"""What a policy is: a press fairkv runs, everything about it in one ``Policy`` (how it is built, its settings, its
backend, its scoring kind, its span-local score for fair eviction), and the rules every policy shares. The policies
themselves are ``fairkv.core.presses.policies``' bindings; ``fairkv.core.presses.registry`` looks them up.

The two backends: ``SCORE_ONCE`` (``fairkv.core.score_once``): a ``ScorerPress`` whose score does not read the ratio
and draws no random numbers, scored once per prompt and cut at every (variant, ratio): the paper's five and most other
scorers; ``PER_SETTING`` (``fairkv.core.per_setting``): the press's own ``compress`` run at each (variant, ratio):
kvpress's wrappers (AdaKV keeps a different number of tokens per head, CriticalKV's score reads the ratio, Block scores
block by block) and the scorers that draw a sketch at every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from kvpress import BasePress

from fairkv.core.presses import scoring

SNAPKV_WINDOW = 16
STREAMING_SINKS = 4
SCORE_ONCE = "score once"
PER_SETTING = "compress per setting"


class PolicyError(ValueError):
    """Unknown policy or press, a press that cannot run here, or an invalid compression ratio."""


# a span-local scorer (Appendix F): (press, module, hidden_states, keys, values, attentions, kwargs, spans) -> scores
LocalScorer = Callable[..., torch.Tensor]
# fair eviction's span-local scores of a scorer without a rule of its own, by how its score reads tokens (a
# declaration names its kind's, so that its stamp covers that one alone; ``own.register`` picks by kind)
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
    is Appendix F's span-local score where the paper gives the policy one, else the kind's (``KIND_SCORERS``, as its
    declaration names it), none for a press built per setting;
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
        if self.local is None:
            raise PolicyError(
                f"no span-local scoring for {self.label} (scoring {self.scoring!r}, {self.backend}): a press of one's "
                "own declares its scoring when registered (fairkv.core.presses.own.register)"
            )
        return self.local(press, module, hidden_states, keys, values, attentions, kwargs, spans)

    def reserved_positions(self, press, n: int) -> tuple[int, ...]:
        """Positions kept whatever the budget, outside fair eviction's split (Appendix F.3: StreamingLLM's sinks)."""
        return self.reserved(press, n) if self.reserved is not None else ()

    def ratio_scores(self, press, keys: torch.Tensor) -> torch.Tensor:
        """The press's own score at its ratio, from the keys alone: a policy ranked otherwise (``rank``) keeps the
        press's score as its base variant's, and StreamingLLM's reads the ratio, so it is rebuilt at each cut."""
        return press.score(None, None, keys, None, None, None)


def check_ratio(ratio: float) -> float:
    """A compression ratio r = 1 - b/n must lie in [0, 1)."""
    if not 0.0 <= float(ratio) < 1.0:
        raise PolicyError(f"compression ratio {ratio} is outside [0, 1): r is the fraction of the prefix evicted")
    return float(ratio)
