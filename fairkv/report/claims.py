"""A claim declared once, as data, beside its study, and the rules that turn its measurement into one line (the words
and counts a set of lines makes: ``fairkv.report.summary``).

A study module (``fairkv.studies.<name>``) declares each claim it tests as a ``Claim``: a stable id, the paper's item
(figure or table), the claim as tested, the paper's words with its numbers (``numbers``: each written once, as a value
that both the printed paper column and the magnitude check read), the region its direction is decided against and why
that bound, the equivalence margin that decides a null and why that margin, and its status: a finding of the paper, a
claim of ours, or a sanity check (it holds on any model by the policy's definition or by construction, so it can
confirm the pipeline but is no finding). The module's function reads its rows into a ``Measured`` per claim (its
parts' estimates, our text, n and, computed from the rows, why it fails or differs) and ``line`` applies these rules:

- **Direction.** Each part is decided by ``verdicts.decide`` against its region (the claim's unless the part names
  its own) with the claim's margin: ``holds``, ``fails`` (outside the region, or a null within the margin: "no effect,
  within +-m"), ``inconclusive`` (its why, from the rows: ``undecided``). A claim of several parts is one line: the
  parts that decide combine by ``verdicts.all_of`` (holds when all hold, fails when any fails), and parts kept for
  information only (an order, a dominance rule the paper does not read) are shown below it.
- **Untestable.** A claim the rows cannot test on this model (the base already at the metric's floor: nothing to
  lower or restore) reads ``untestable here`` with the reason, which its measurement computes from the rows.
- **The judge's gate.** A claim that rests on the judge's scores (``judged``) decides nothing while the judge's
  calibration is too poor (``Measured.gate``): inconclusive, no magnitude. Claims about the judge are not gated.
- **Magnitude.** For each paper number the claim declares and the measurement estimates, ``verdicts.magnitude`` with
  that number's kind and this model's ceiling for it (``Measured.ceilings``: a number above it is untestable here,
  the why says ``ceiling: ...``); a claim's magnitude is ``verdicts.all_magnitudes`` of its numbers, and where a
  change matches while a level differs (or the other way) the line says which. Every claim the paper gives a number
  for is sized or says why not: untestable here where its direction is (the why says why), too uncertain where it
  rests on the judge while the judge is too poor; n.a. only where the paper gives no number.
- **Mechanism.** A claim on a mitigation (``Claim.mitigation``) is also judged on what moved its number
  (``Measured.mechanism``, read by ``fairkv.studies.mechanism``), against the uncompressed model: the paper's, partly
  the paper's, other, inconclusive (``verdicts.MECHANISM_WORDS``); n.a. for every other claim and where the direction
  decides nothing. Its numbers go to ``why``.
- **Multiplicity.** Every direction is decided again at the Bonferroni level 1 - 5% / k, k the findings declared
  across the studies (``fairkv.studies.family``); the column ``bonferroni`` shows the verdict there when it differs.
- **Decoding noise.** Where the profile's decoding noise was measured (``fairkv.report.noise``), a claim whose
  deciding part has an interval end within the noise's reach of a threshold (its bound, or the bound +- its margin),
  or whose mechanism reads another verdict with one of its comparisons moved by that reach (``Mechanism.moved``), says
  so in the column ``noise``: re-decoding its cells under another batch plan could move its verdict, or its mechanism's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from fairkv.report import verdicts
from fairkv.report.noise import Noise

FINDING, OURS, SANITY = "finding", "ours", "sanity check"
# a finding of the paper read again on the second model (Fig 10's): a line of its own, apart from the reproduction's
SECOND_MODEL = "finding, second model"
STATUSES = (FINDING, SECOND_MODEL, OURS, SANITY)
COLUMNS = ("id", "figure", "claim", "paper", "ours", "n", "verdict", "magnitude", "mechanism", "why", "bonferroni",
           "noise", "status", "part")  # fmt: skip
NO_NUMBER = "no number"  # the paper column of a claim the paper states in words only
MECHANISM_NOISE = "the mechanism within decoding noise: "  # what ``near_noise`` says of the mechanism's comparisons


class ClaimError(ValueError):
    """A declaration or a measurement the rules cannot read."""


@dataclass(frozen=True)
class Number:
    """One of the paper's numbers (read off its figures, approximate, Llama-3.1-8B unless noted), or its range, and
    the kind of quantity it is (``verdicts.TOLERANCE``)."""

    value: float | tuple[float, float]
    kind: str

    def __post_init__(self):
        if self.kind not in verdicts.TOLERANCE:
            raise ClaimError(f"unknown kind {self.kind!r}: use one of {', '.join(verdicts.TOLERANCE)}")

    def __str__(self) -> str:
        low, high = self.value if isinstance(self.value, tuple) else (self.value, self.value)
        show = _percent if self.kind == "share" else _cost if self.kind == "cost" else _plain
        return show(low) if low == high else f"{show(low)} to {show(high)}"


def _plain(value: float) -> str:
    return verdicts.number(value, "+" if value < 0 else "")


def _percent(value: float) -> str:
    return f"{value:.0%}"


def _cost(value: float) -> str:
    return f"x{value:.2f}"


@dataclass(frozen=True)
class Claim:
    """A claim as tested here, declared once (see the module's docstring)."""

    id: str  # stable: "<study>.<name>"
    figure: str  # the paper's item (Fig 4, Table 1) or, beyond the paper, our figure's name
    claim: str  # what is tested, in words (it may quote the study's settings, never a paper number)
    paper: str  # the paper's words; {name} fields print ``numbers[name]``
    numbers: dict[str, Number] = field(default_factory=dict)
    above: float | None = None  # the direction's region: value > above and/or value < below
    below: float | None = None
    region: str = ""  # why that bound (a threshold of the claim's own needs its reason)
    margin: float | None = None  # a null within +-margin of the bound reads fails
    null: str = ""  # why that margin
    status: str = FINDING
    effect: bool = True  # a change or a gap (a null is decided with ``margin``); False: a level against a bound
    judged: bool = False  # rests on the judge's scores: the judge's gate applies
    parts: str = ""  # how several parts make one verdict, when they do
    score: str = ""  # the row score whose decoding noise reaches the claim ("": it reads no decoded answer)
    cells: tuple = ()  # runs.redecode.Cells its deciding parts read: decoded again where decoding noise reaches it
    mitigation: str = ""  # the mitigation (whitelist, fair) whose mechanism the claim is judged on ("": none)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ClaimError(f"{self.id}: unknown status {self.status!r}: use one of {', '.join(STATUSES)}")
        if self.above is None and self.below is None:
            raise ClaimError(f"{self.id}: a claim needs a region (above and/or below)")
        if (self.above is not None or self.below is not None) and not self.region:
            raise ClaimError(f"{self.id}: say why the bound is where it is (region)")
        if self.margin is not None and not self.null:
            raise ClaimError(f"{self.id}: say why the equivalence margin is {self.margin:g} (null)")
        one_bound = (self.above is None) != (self.below is None)
        if self.status != SANITY and self.effect and one_bound and self.margin is None:
            raise ClaimError(f"{self.id}: a claimed effect needs an equivalence margin, so that a null is decided")
        try:
            self.paper_text
        except KeyError as missing:
            raise ClaimError(f"{self.id}: the paper's words name {missing}, which is not among its numbers") from None

    @property
    def paper_text(self) -> str:
        return self.paper.format(**{name: str(number) for name, number in self.numbers.items()})


@dataclass(frozen=True)
class Mechanism:
    """What moved a mitigation's number, read from rows (``fairkv.studies.mechanism``): the verdict (one of
    ``verdicts.MECHANISMS``), why in a phrase (``because``), the numbers it rests on (``sides``: what -> "base ->
    mitigation (change)"), the paired comparisons it is decided by (``deciding``: what, the score compared, its
    estimate) and the verdict it reads with the i-th of them moved by a distance (``moved``): ``near_noise``'s."""

    verdict: str
    because: str
    sides: tuple[tuple[str, str], ...] = ()
    deciding: tuple[tuple[str, str, verdicts.Estimate], ...] = field(default=(), compare=False)
    moved: Callable[[int, float], str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.verdict not in verdicts.MECHANISMS:
            raise ClaimError(f"unknown mechanism verdict {self.verdict!r}: use one of {', '.join(verdicts.MECHANISMS)}")

    @property
    def said(self) -> str:
        return "; ".join(f"{what} {levels}" for what, levels in self.sides)

    def __str__(self) -> str:
        return f"{self.verdict}, {self.because}: {self.said}" if self.because else self.verdict


@dataclass(frozen=True)
class Part:
    """One part of a claim: its estimate, what it is (label), and whether it decides the claim's direction (a part
    shown for information does not). ``above``/``below``: the part's own region, when not the claim's, with its own
    equivalence ``margin`` (None: no null is decided, as for a bound that says "no worse than")."""

    label: str
    estimate: verdicts.Estimate
    decides: bool = True
    above: float | None = None
    below: float | None = None
    margin: float | None = None


@dataclass(frozen=True)
class Measured:
    """What a study's rows say about one claim: its parts, our text, n (the prompts the rows it reads hold), our
    estimates of the paper's numbers (``sizes``, by the names of ``Claim.numbers``), and, computed from the rows, why
    it fails or differs (``why``), why it cannot be tested here (``untestable``), or why the judge decides nothing
    (``gate``)."""

    parts: list[Part]
    ours: str
    n: int
    sizes: dict[str, verdicts.Estimate] = field(default_factory=dict)
    why: str = ""
    untestable: str = ""
    gate: str = ""
    mechanism: Mechanism | None = None  # what moved the number, for a claim on a mitigation (``Claim.mitigation``)
    # what this model reaches with nothing holding it back (``fairkv.studies.ceilings``), by the names of
    # ``Claim.numbers``: a paper's number above it reads untestable here in magnitude
    ceilings: dict[str, verdicts.Estimate] = field(default_factory=dict)


def _region(claim: Claim, part: Part) -> tuple[float | None, float | None, float | None]:
    """(above, below, margin) a part is decided against: its own region and margin, or the claim's."""
    if part.above is not None or part.below is not None:
        return part.above, part.below, part.margin
    one_bound = (claim.above is None) != (claim.below is None)
    return claim.above, claim.below, claim.margin if one_bound else None


def decided(claim: Claim, part: Part, level: float = verdicts.LEVEL) -> str:
    """The part's direction verdict against its region (its own, or the claim's) at ``level``."""
    above, below, margin = _region(claim, part)
    return verdicts.decide(part.estimate, above, below, margin, level)


def direction(claim: Claim, measured: Measured, level: float = verdicts.LEVEL) -> str:
    """The claim's direction verdict at ``level`` (the rules of the module's docstring)."""
    if measured.untestable:
        return verdicts.UNTESTABLE
    if claim.judged and measured.gate:
        return verdicts.INCONCLUSIVE
    deciding = [part for part in measured.parts if part.decides]
    if not deciding:
        raise ClaimError(f"{claim.id}: no part decides the claim")
    return verdicts.all_of([decided(claim, part, level) for part in deciding])


def magnitude(claim: Claim, measured: Measured) -> tuple[str, str]:
    """(the claim's magnitude verdict, a note naming which of its numbers match and which differ when they part)."""
    unknown = set(measured.sizes) - set(claim.numbers)
    if unknown:
        raise ClaimError(
            f"{claim.id}: sizes {sorted(unknown)} are not among the paper's numbers {sorted(claim.numbers)}"
        )
    if not claim.numbers:
        return verdicts.NOT_APPLICABLE, ""
    if measured.untestable:
        return verdicts.UNTESTABLE, ""
    if claim.judged and measured.gate:
        return verdicts.TOO_UNCERTAIN, ""
    if not measured.sizes:
        raise ClaimError(f"{claim.id}: the paper gives numbers ({', '.join(claim.numbers)}): measure them (sizes)")
    each = {
        name: verdicts.magnitude(
            estimate, claim.numbers[name].value, claim.numbers[name].kind, measured.ceilings.get(name)
        )
        for name, estimate in measured.sizes.items()
    }
    said = {verdict: [name for name, v in each.items() if v == verdict] for verdict in verdicts.MAGNITUDES}
    mixed = sum(bool(names) for names in said.values()) > 1
    note = "; ".join(f"{', '.join(names)} {verdict}" for verdict, names in said.items() if names) if mixed else ""
    return verdicts.all_magnitudes(list(each.values())), note


ABOVE_CEILING = "out of the attack's reach here"  # a why's conclusion for a paper's number above this model's ceiling
CEILING = rf"ceiling: (.*?); {ABOVE_CEILING}"  # the numbers of that why: each of the paper's, with the ceiling


def above_ceiling(claim: Claim, measured: Measured) -> str:
    """The why of a magnitude untestable here: each of the paper's numbers above this model's ceiling, with it."""
    said = [
        f"{name}: the paper's {claim.numbers[name]}, this model's ceiling {ceiling}"
        for name, ceiling in measured.ceilings.items()
        if name in measured.sizes
        and verdicts.magnitude(measured.sizes[name], claim.numbers[name].value, claim.numbers[name].kind, ceiling)
        == verdicts.UNTESTABLE
    ]
    return f"ceiling: {', '.join(said)}; {ABOVE_CEILING}" if said else ""


def mechanism(claim: Claim, measured: Measured) -> Mechanism:
    """The claim's mechanism verdict: its measurement's for a claim on a mitigation, n.a. otherwise and where the
    direction decides nothing (untestable, or the judge's gate). A mitigation claim measured without one, or a claim
    on none measured with one, is an error."""
    if bool(claim.mitigation) != (measured.mechanism is not None):
        raise ClaimError(
            f"{claim.id}: a claim on a mitigation (Claim.mitigation) is measured with its mechanism "
            "(Measured.mechanism), and only such a claim"
        )
    if measured.mechanism is None or measured.untestable or (claim.judged and measured.gate):
        return Mechanism(verdicts.NOT_APPLICABLE, "")
    return measured.mechanism


def bonferroni_level(family: int) -> float:
    """The level at which each of ``family`` claims is decided again (Bonferroni: 1 - 5% / family)."""
    return 1 - (1 - verdicts.LEVEL) / max(family, 1)


def near_noise(claim: Claim, measured: Measured, noise: Noise | None) -> str:
    """The deciding parts whose verdict hangs on an interval end nearer its threshold than decoding the part's cells
    again may move it (``Noise.reach``): the bound for any verdict, and the bound +- the margin where the part is a
    null or undecided; then the mechanism's comparisons that, moved by that reach either way, change its verdict
    ("" when none, or when no noise was measured)."""
    if noise is None or measured.untestable:
        return ""
    said, moved, reading = [], [], mechanism(claim, measured)
    for index, (what, score, estimate) in enumerate(reading.deciding if reading.moved else ()):
        reach = noise.reach(score, estimate.n)
        flips = sorted({reading.moved(index, sign * reach) for sign in (-1, 1)} - {reading.verdict})
        if flips and not estimate.too_few and not math.isnan(estimate.low):
            moved.append(f"{what} {estimate.signed()}, moved by {verdicts.number(reach)}: {' or '.join(flips)}")
    for part in measured.parts if claim.score else ():  # a claim reading no decoded score: its mechanism's alone
        if not part.decides or part.estimate.too_few or math.isnan(part.estimate.low):
            continue
        above, below, margin = _region(claim, part)
        bounds = [b for b in (above, below) if b is not None]
        thresholds = set(bounds)
        if margin is not None and decided(claim, part, verdicts.LEVEL) != verdicts.HOLDS:
            thresholds |= {b + sign * margin for b in bounds for sign in (-1, 1)}
        reach = noise.reach(claim.score, part.estimate.n)
        close = min(abs(end - t) for end in (part.estimate.low, part.estimate.high) for t in thresholds)
        if close < reach:
            said.append(f"{part.label} {verdicts.number(close)} from its threshold (reach {verdicts.number(reach)})")
    said = [f"within decoding noise ({claim.score}): " + "; ".join(said)] if said else []
    return "; ".join(said + ([MECHANISM_NOISE + "; ".join(moved)] if moved else []))


# the kinds a why's reasons open with ('model: ...; mechanism: ...'), each study's, and ``undecided``'s
WHY_KINDS = ("uncertain", "model and budget", "model", "budget", "code", "machine", "mitigation", "ceiling")
UNDECIDED = {  # an inconclusive claim's reason: a phrase per situation of ``SITUATIONS`` that gives inconclusive
    "straddles": "straddles its bound",
    "undefined": "undefined here",
    "few": "too few prompts",
    "gate": "the judge too poor",
}


def undecided(claim: Claim, measured: Measured) -> str:
    """Why an inconclusive claim decides nothing, from its rows: the judge's gate, or each undecided deciding part (the
    bound its interval straddles, a statistic undefined, too few prompts), then their situations (``UNDECIDED``)."""
    if claim.judged and measured.gate:
        return f"uncertain: {UNDECIDED['gate']}"  # its numbers are in ``ours``
    said, situations = [], []
    for part in measured.parts:
        if not part.decides or decided(claim, part) != verdicts.INCONCLUSIVE:
            continue
        estimate = part.estimate
        if estimate.too_few:
            said.append(f"{part.label} over {estimate.n} prompt(s)")
            situations.append(UNDECIDED["few"])
            continue
        above, below, _ = _region(claim, part)
        crossed = [b for b in (above, below) if b is not None and estimate.low <= b <= estimate.high]
        if any(math.isnan(v) for v in (estimate.value, estimate.low, estimate.high)) or not crossed:
            said.append(f"{part.label} undefined")
            situations.append(UNDECIDED["undefined"])
        else:
            said.append(f"{part.label} {estimate.signed()} straddles {verdicts.number(crossed[0])}")
            situations.append(UNDECIDED["straddles"])
    return "uncertain: " + "; ".join(said + list(dict.fromkeys(situations)))


def line(claim: Claim, measured: Measured, family: int, noise: Noise | None = None) -> list[dict]:
    """The claim's line (and one row per part, below it, when it has several): see the module's docstring."""
    verdict = direction(claim, measured)
    size, note = magnitude(claim, measured)
    tested = claim.status != SANITY  # a sanity check is outside the Bonferroni family
    again = direction(claim, measured, bonferroni_level(family)) if tested else verdict
    ours = measured.ours
    if verdict == verdicts.FAILS and _null(claim, measured):
        ours += f"; no effect, within +-{claim.margin:g}"
    if note:
        ours += f"; the paper's numbers: {note}"
    if measured.untestable:
        ours += f"; untestable here: {measured.untestable}"
    if claim.judged and measured.gate:
        ours += f"; {measured.gate}"
    why = measured.why if verdict in (verdicts.FAILS, verdicts.UNTESTABLE) or size == verdicts.DIFFERS else ""
    if size == verdicts.UNTESTABLE:
        why = "; ".join(filter(None, [why, above_ceiling(claim, measured)]))
    if verdict == verdicts.INCONCLUSIVE:
        why = "; ".join(filter(None, [undecided(claim, measured), why]))
    moved = mechanism(claim, measured)
    if moved.verdict != verdicts.NOT_APPLICABLE:
        why = "; ".join(filter(None, [why, f"mechanism: {moved}"]))
    head = {
        "id": claim.id,
        "figure": claim.figure,
        "claim": claim.claim,
        "paper": claim.paper_text,
        "ours": ours,
        "n": int(measured.n),
        "verdict": verdict,
        "magnitude": size,
        "mechanism": moved.verdict,
        "why": why,
        "bonferroni": again if again != verdict else "",
        "noise": near_noise(claim, measured, noise),
        "status": claim.status,
        "part": "",
    }
    if len(measured.parts) < 2:
        return [head]
    rows = [head]
    for part in measured.parts:
        verdict_here = decided(claim, part, verdicts.LEVEL) if not measured.untestable else verdicts.UNTESTABLE
        rows.append(
            {
                **{column: "" for column in COLUMNS},
                "id": claim.id,
                "figure": claim.figure,
                "claim": claim.claim,
                "ours": f"{part.label} {part.estimate.signed()}",
                "n": int(part.estimate.n),
                "verdict": verdict_here if part.decides else f"({verdict_here})",
                "status": claim.status,
                "part": part.label if part.decides else f"{part.label} (shown, does not decide)",
            }
        )
    return rows


def _null(claim: Claim, measured: Measured) -> bool:
    """Every deciding part a null within its margin (the claim's, or the part's own)."""
    regions = [(part, _region(claim, part)) for part in measured.parts if part.decides]
    return claim.margin is not None and all(
        margin is not None and verdicts.is_null(part.estimate, above if above is not None else below, margin)
        for part, (above, below, margin) in regions
    )


def table(lines: list[list[dict]]) -> pd.DataFrame:
    """A study's paper-vs-us table: its claims' lines in order, each with its parts below it."""
    return pd.DataFrame([row for rows in lines for row in rows], columns=list(COLUMNS))


def heads(claims: pd.DataFrame) -> pd.DataFrame:
    """One row per claim (its parts left out)."""
    return claims[claims["part"] == ""]


def beyond_reach(claims: pd.DataFrame) -> pd.Series:
    """Which lines of a claims table read untestable here in magnitude because the paper's number lies above this
    model's ceiling (their why says so: ``ABOVE_CEILING``), not because their direction is untestable."""
    return (claims["magnitude"] == verdicts.UNTESTABLE) & claims["why"].str.contains(ABOVE_CEILING, regex=False)
