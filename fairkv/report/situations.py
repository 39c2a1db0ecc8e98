"""One situation, one label, on every page (issue 66): the situations a claim's rows can be in and the one label its
direction (``fairkv.report.claims.direction``), magnitude (``claims.magnitude``) or mechanism
(``fairkv.studies.mechanism.read``) gets there, each with where it is applied; docs/results.md prints this table."""

from __future__ import annotations

from dataclasses import dataclass

from fairkv.report import verdicts


@dataclass(frozen=True)
class Situation:
    """A situation a claim's rows can be in, the one label its direction gets there, and where that is applied."""

    name: str
    label: str
    by: str
    verdict: str = "direction"  # the verdict it labels: "direction", "magnitude" or "mechanism"


# ``claims.direction`` and ``claims.magnitude`` apply them (a measurement names the untestable ones, with the reason the
# helper in ``by`` computes from the rows)
SITUATIONS = (
    Situation(
        "the interval lies wholly inside the claimed region (and not wholly within its margin)",
        verdicts.HOLDS,
        "verdicts.decide",
    ),
    Situation("the interval lies wholly outside the claimed region", verdicts.FAILS, "verdicts.decide"),
    Situation(
        "a null: an effect's interval lies wholly within the claim's margin of no effect",
        verdicts.FAILS,
        "verdicts.decide",
    ),
    Situation(
        "a rise claimed from a metric's floor that does not come (the metric could have risen)",
        verdicts.FAILS,
        "verdicts.decide",
    ),
    Situation(
        "a drop or a restoration claimed where the base already lies within the margin of the metric's floor or "
        "ceiling: nothing to lower or restore",
        verdicts.UNTESTABLE,
        "reading.untestable_below, reading.no_room",
    ),
    Situation(
        "a level claimed above a bar the uncompressed model itself lies wholly below",
        verdicts.UNTESTABLE,
        "reading.unreachable",
    ),
    Situation(
        "the paper's number lies wholly above the interval of what this model reaches in its positive controls (the "
        "paper's attack at the claim's policy and ratio with neutral text in the defense's place or with no defense, "
        "whichever reaches higher; the accuracy uncompressed at the paper's budget); for a change, its smallest size",
        verdicts.UNTESTABLE,
        "verdicts.magnitude (Measured.ceilings, fairkv.studies.ceilings)",
        "magnitude",
    ),
    Situation(
        "our interval is narrower than the tolerance and lies inside the paper's number widened by it (for an effect, "
        "a change or a score, the tolerance is at most half the paper's size of it, so that a match tells the effect "
        "from none)",
        verdicts.MATCHES,
        "verdicts.magnitude, verdicts.tolerance",
        "magnitude",
    ),
    Situation(
        "the paper's number widened by the tolerance lies wholly outside our interval",
        verdicts.DIFFERS,
        "verdicts.magnitude",
        "magnitude",
    ),
    Situation(
        "the paper's number widened by the tolerance overlaps our interval, too wide to say which",
        verdicts.TOO_UNCERTAIN,
        "verdicts.magnitude",
        "magnitude",
    ),
    Situation(
        "the claim's direction is untestable here: its number is not sized either",
        verdicts.UNTESTABLE,
        "claims.magnitude",
        "magnitude",
    ),
    Situation(
        "the claim rests on the judge while its calibration is too poor: its number is not sized either",
        verdicts.TOO_UNCERTAIN,
        "claims.magnitude",
        "magnitude",
    ),
    Situation("the paper gives no number", verdicts.NOT_APPLICABLE, "claims.magnitude", "magnitude"),
    Situation(
        "the base policy lost the attack's refusal (its change from r = 0 below 0, no null within "
        "`reading.RATE_MARGIN`) and the mitigation's is back within that margin of the uncompressed model's, benign "
        "queries refused no more than it refuses them (within the same margin)",
        verdicts.PAPERS,
        "mechanism.read",
        "mechanism",
    ),
    Situation(
        "the base lost the refusal and the mitigation is not shown back within the margin of the uncompressed "
        "level, but raises it over the base's by at least `mechanism.PARTLY` (half) of what the base lost, at no such "
        "price",
        verdicts.PARTLY,
        "mechanism.read",
        "mechanism",
    ),
    Situation(
        "the mitigation lowers the refusal, or stays short of the uncompressed level by a rise under half of the loss "
        "(or none), or refuses benign queries beyond the uncompressed model",
        verdicts.OTHER,
        "mechanism.read",
        "mechanism",
    ),
    Situation(
        "the base policy kept the refusal (its change from r = 0 a null within the margin) and so does the "
        "mitigation: nothing was restored; or the uncompressed model does not refuse the attack",
        verdicts.NOT_APPLICABLE,
        "mechanism.read",
        "mechanism",
    ),
    Situation(
        "a claim on no mitigation, or one whose direction decides nothing (untestable here, or resting on a judge too "
        "poor): not judged on its mechanism",
        verdicts.NOT_APPLICABLE,
        "claims.mechanism",
        "mechanism",
    ),
    Situation(
        "an interval its reading turns on straddles its bound, or the benign side was not run there",
        verdicts.INCONCLUSIVE,
        "mechanism.read",
        "mechanism",
    ),
    Situation(
        "a cost the paper's implementation pays for a step ours does not take (its second pass over the prompt)",
        verdicts.UNTESTABLE,
        "studies.runtime.measure",
    ),
    Situation("the interval straddles the claimed region's bound", verdicts.INCONCLUSIVE, "verdicts.decide"),
    Situation(
        "a statistic undefined on the data (NaN: a kind with too few classes, too few draws defined)",
        verdicts.INCONCLUSIVE,
        "verdicts.decide",
    ),
    Situation(
        f"a bootstrap over fewer than {verdicts.MIN_BOOTSTRAP} prompts", verdicts.INCONCLUSIVE, "verdicts.decide"
    ),
    Situation("a claim resting on the judge while its calibration is too poor", verdicts.INCONCLUSIVE, "Measured.gate"),
)


KINDS = ("direction", "magnitude", "mechanism")  # the verdicts the table labels, in the order it prints them


def in_order() -> list[Situation]:
    """The situations as the results page prints them: direction's, then magnitude's, then mechanism's."""
    return sorted(SITUATIONS, key=lambda situation: KINDS.index(situation.verdict))
