"""One situation, one label, on every page (issue 66): the situations a claim's rows can be in and the one label its
direction (``fairkv.report.claims.direction``) or magnitude (``claims.magnitude``) gets there, each with where it is
applied; docs/results.md prints this table."""

from __future__ import annotations

from dataclasses import dataclass

from fairkv.report import verdicts


@dataclass(frozen=True)
class Situation:
    """A situation a claim's rows can be in, the one label its direction gets there, and where that is applied."""

    name: str
    label: str
    by: str
    verdict: str = "direction"  # the verdict it labels: "direction" (``direction``) or "magnitude" (``magnitude``)


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
