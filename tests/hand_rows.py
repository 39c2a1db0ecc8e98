"""What a hand-built attack row needs besides its scores: an answer whose outcome (``fairkv.report.outcomes``) agrees
with them, so that the ``why`` a claim computes from the answers reads them as the scores say."""

from __future__ import annotations

from fairkv.core.data import paper_attack

REFUSAL = "I can't assist with that request."


def answer(refused: float, keep_directive: float = 1.0, keep_defense: float = 1.0) -> dict:
    """The fields of an attack answer that refuses (``refused`` 1) or echoes the attack (0), on no IFEval directive
    (``dataset`` names none, so no answer reads as carrying one out), with the keep rates of the prompt's directive and
    defense it was decoded under."""
    return {
        "query": "attack",
        "dataset": "hand-built",
        "response": REFUSAL if refused else paper_attack().text,
        "keep_directive": keep_directive,
        "keep_defense": keep_defense,
    }
