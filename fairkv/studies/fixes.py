"""Notebook 13, which fix, at what price (ours, beyond the paper): every mitigation of instruction eviction side by
side, per policy and ratio, judged by the same rules on the same prompts.

The fixes: the paper's whitelist (Section 5.1) and fair eviction (Section 5.2), boundary protection (not the paper's:
after "Protection Is (Nearly) All You Need", arXiv 2605.18053, ``selection.boundary_positions``: 10% of the budget kept
at each boundary of the system prompt, its start, the junction of its defense and directive, its end), and reordering
the prompt: the defense last (the flipped order of Fig 5 under the base policy) and the defense's operative sentence
last in the defense (notebook 11's geometry study, StreamingLLM and SnapKV). Each is read against the uncompressed
model as the paper's mitigations are (``fairkv.studies.mechanism``): the attack's refusal restored or not, the benign
queries' refusal (the price), with directive accuracy and directive leakage beside them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from fairkv.core.presses import PAPER
from fairkv.report import analysis, verdicts
from fairkv.report.claims import OURS, Claim, Measured, Part
from fairkv.report.figures import suptitle
from fairkv.runs.redecode import Cells
from fairkv.runs.studies import (
    CI_MITIGATION_RATIOS,
    CI_PROMPTS,
    CPU_MITIGATION_RATIOS,
    GROWN_SIDE,
    NORMAL,
    TEN_RATIOS,
    Fields,
    Scale,
    Study,
)
from fairkv.studies import mechanism, reading

# Boundary protection beside the base policy, the ratios the paper plots its mitigations at; at the cpu profile the
# attack on the 100 prompts of notebooks 05-06 (2,500 cells, 41 min 31 s here, ``MINUTES``);
# its benign side (an answer of up to 256 tokens, about six attack answers) is not run there yet: the table says so
BOUNDARY = Study(
    "boundary",
    "13",
    "beyond the paper: boundary protection (arXiv 2605.18053)",
    Fields(variants=("base", "boundary")),
    {
        "ci": Scale(n_prompts=CI_PROMPTS, ratios=CI_MITIGATION_RATIOS),
        "cpu": Scale(ratios=CPU_MITIGATION_RATIOS, orders=NORMAL, queries=("attack",)),
        "paper": Scale(n_prompts=100, ratios=TEN_RATIOS[:8]),
    },
    figures=("13_fixes_table", "13_fixes", "13_recommended", "13_paper_vs_us"),
    sweep=False,
)
DEFENSE_LAST, OPERATIVE_LAST = "defense last", "operative last"  # the reorderings, as fixes
WHITELISTED_LAST = "defense last + whitelist"  # the reordering and the whitelist together
FIXES = ("whitelist", "fair", "boundary", DEFENSE_LAST, WHITELISTED_LAST, OPERATIVE_LAST)
OPERATIVE_TEMPLATE = "operative_last"  # notebook 11's template with the operative sentence at the defense's end
# The benign side (the price) where notebooks 05 and 06 did not run it: at r = 0.3, the lowest ratio the table shows,
# for the base policy, the whitelist and fair eviction (on the 100 prompts their benign side has at r = 0.4-0.7; a
# fix's line reads the base policy's beside it, ``mechanism.read``) and the defense last (the flipped order's base
# policy, as at its other ratios; StreamingLLM's is notebook 06's) and the defense last + whitelist (the flipped
# order's whitelist, every policy). No study notebook 13 reads asks for any of these cells (tests/test_fixes.py). Not
# run: the price of boundary protection (r = 0.3-0.7) and of the operative sentence last (notebook 11 runs the attack
# only): where a fix's refusal is not as the uncompressed model's, no price makes it hold (the table says not
# measured); the price of the defense last + whitelist at r = 0.4-0.7, where its refusal is (the next to compute).
LOW = 0.3
PRICES = tuple(
    Study(
        f"price_{name}",
        "13",
        f"beyond the paper: the benign price of {what} at r = {LOW:g}",
        Fields(queries=("benign",), **axes),
        {
            "ci": Scale(n_prompts=CI_PROMPTS, ratios=(LOW,), policies=("streamingllm",), benign=benign),
            "cpu": Scale(ratios=(LOW,), benign=benign),
            "paper": Scale(n_prompts=100, ratios=(LOW,), benign=benign),
        },
        sweep=False,
    )
    for name, what, axes, benign in (
        (
            "mitigations",
            "the whitelist and fair eviction",
            dict(orders=NORMAL, variants=("base", "whitelist", "fair")),  # the base policy's: read beside each fix
            GROWN_SIDE,
        ),
        (
            "defense_last",
            DEFENSE_LAST,
            dict(orders=("flipped",), variants=("base",), policies=PAPER[1:]),  # StreamingLLM's: notebook 06's
            dict(orders=("flipped",), **GROWN_SIDE),
        ),
        (
            "whitelist_last",
            WHITELISTED_LAST,
            dict(orders=("flipped",), variants=("whitelist",)),  # read beside the base policy's, as every fix
            dict(orders=("flipped",), **GROWN_SIDE),
        ),
    )
)
# The whitelist with the defense last (the flipped order, the defense's key phrase always kept): the fix a practitioner
# who reorders and whitelists gets. At the cpu profile the attack at the table's ratios on the 100 prompts (2,500
# cells; the flipped order's base and uncompressed rows are notebook 06's); its benign side (the price) at r = 0.3
# (``PRICES``)
WHITELIST_LAST = Study(
    "whitelist_last",
    "13",
    "beyond the paper: the whitelist with the defense last",
    Fields(orders=("flipped",), variants=("base", "whitelist")),
    {
        "ci": Scale(n_prompts=CI_PROMPTS, ratios=CI_MITIGATION_RATIOS, policies=("streamingllm",)),
        "cpu": Scale(ratios=CPU_MITIGATION_RATIOS, queries=("attack",)),
        "paper": Scale(n_prompts=100, ratios=TEN_RATIOS[:8]),
    },
    sweep=False,
)
STUDIES = (BOUNDARY, *PRICES, WHITELIST_LAST)
AS_UNCOMPRESSED, PRICE, BELOW = (
    "as uncompressed",
    "a price",
    "below it",
)  # the refusal against the uncompressed model, the price
UNDECIDED, NONE, NOT_MEASURED = "undecided", "none", "not measured"
MARKERS = dict(zip(FIXES, "osD^Pv"))
COLOURS = dict(zip(FIXES, ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9")))


def gathered(*frames: pd.DataFrame) -> pd.DataFrame:
    """Every fix's rows in one frame (each study's rows with ``analysis.with_benign_flags`` applied; a row several
    studies hold, once): the normal order's base, whitelist, fair and boundary rows as they are; the flipped order's
    compressed base rows as the fix ``defense last``, its compressed whitelist rows as ``defense last + whitelist`` and
    notebook 11's compressed base rows with the operative sentence last as ``operative last``, all in the normal order.
    Their own uncompressed rows are left out: every fix is read against the uncompressed model with the prompt as the
    user wrote it (normal order, the paper's defense)."""
    rows = pd.concat(frames, ignore_index=True).drop_duplicates(["cell_id", "policy", "variant"], ignore_index=True)
    template = rows["template"] if "template" in rows else pd.Series(None, index=rows.index, dtype=object)
    plain, compressed = template.isna(), rows["ratio"] > 0
    normal = rows[plain & (rows["order"] == "normal") & rows["variant"].isin(("base", *FIXES[:3]))]
    flipped = rows[plain & compressed & (rows["order"] == "flipped")]
    moved = rows[(template == OPERATIVE_TEMPLATE) & compressed & (rows["variant"] == "base")]
    out = pd.concat(
        [
            normal,
            flipped[flipped["variant"] == "base"].assign(order="normal", variant=DEFENSE_LAST),
            flipped[flipped["variant"] == "whitelist"].assign(order="normal", variant=WHITELISTED_LAST),
            moved.assign(variant=OPERATIVE_LAST),
        ],
        ignore_index=True,
    )
    return out.drop(columns=[c for c in ("template", "place", "keep_operative") if c in out])


def _decided(estimate: verdicts.Estimate | None, **bound) -> str:
    return NOT_MEASURED if estimate is None else verdicts.decide(estimate, **bound)


def _level(rows: pd.DataFrame, metric: str, query: str, ratio: float, fix: str, policy: str) -> str:
    """The mean of ``metric`` with its interval and n, or not measured."""
    picked = rows[(rows["query"] == query) & (rows["policy"] == policy) & (rows["variant"] == fix)]
    picked = picked[picked["ratio"].round(6) == round(ratio, 6)]
    if picked.empty:
        return NOT_MEASURED
    estimate = verdicts.mean(picked.groupby("key")[metric].mean())
    return f"{estimate} (n = {estimate.n})"


def one(rows: pd.DataFrame, fix: str, policy: str, ratio: float) -> dict | None:
    """One line of the table: the fix at ``policy`` and ``ratio`` against the uncompressed model (the attack's refusal
    and the benign queries', each with its paired interval), the mechanism as notebooks 05-06 read it, directive
    accuracy and leakage, and whether it holds (the refusal within the margin of the uncompressed model's, no price);
    None where its attack side did not run."""
    back = mechanism.from_uncompressed(rows, "refused", "attack", ratio, fix, policy)
    if back is None:
        return None
    price = mechanism.from_uncompressed(rows, "benign_refused", "benign", ratio, fix, policy)
    found = mechanism.read(rows, fix, ratio, policy)
    refusal = {verdicts.HOLDS: AS_UNCOMPRESSED, verdicts.FAILS: BELOW}.get(
        _decided(back, above=-reading.RATE_MARGIN), UNDECIDED
    )
    cost = {verdicts.HOLDS: NONE, verdicts.FAILS: PRICE, NOT_MEASURED: NOT_MEASURED}.get(
        _decided(price, below=reading.RATE_MARGIN), UNDECIDED
    )
    sides = dict(found.sides)
    return {
        "fix": fix,
        "policy": policy,
        "ratio": ratio,
        "attack refused": sides["attack refused"],
        "refusal": refusal,
        "benign refused": sides["benign refused"],
        "price": cost,
        "directive accuracy": _level(rows, analysis.ACCURACY, "benign", ratio, fix, policy),
        "directive leakage": _level(rows, analysis.LEAKAGE, "attack", ratio, fix, policy),
        "mechanism": f"{found.verdict} ({found.because})",
        "holds": refusal == AS_UNCOMPRESSED and cost == NONE,
        "refused_change": back.value,
        "refused_low": back.low,
        "refused_high": back.high,
        "price_change": price.value if price else float("nan"),
        "price_low": price.low if price else float("nan"),
        "price_high": price.high if price else float("nan"),
    }


def table(rows: pd.DataFrame) -> pd.DataFrame:
    """Every fix the rows hold, per policy (the paper's order) and ratio the paper plots its mitigations at
    (``mechanism.PLOTTED``) where its attack side ran: ``one``'s line."""
    lines = [
        line
        for fix in FIXES
        for policy in PAPER
        for ratio in mechanism.PLOTTED
        if (line := one(rows, fix, policy, ratio)) is not None
    ]
    if not lines:
        raise mechanism.MechanismError("no fix's attack rows beside the uncompressed model's")
    return pd.DataFrame(lines)


def holds_to(lines: pd.DataFrame) -> tuple[float | None, str]:
    """Up to which ratio a fix holds at every ratio it ran from the lowest (None: not at its lowest), and in words where
    and why it stops: 'to r = 0.5; at 0.6: price undecided', or 'not at r = 0.3: refusal below it'."""
    reached = None
    for _, line in lines.sort_values("ratio").iterrows():
        if not line["holds"]:
            cost = "a benign price" if line["price"] == PRICE else f"price {line['price']}"
            why = f"refusal {line['refusal']}" if line["refusal"] != AS_UNCOMPRESSED else cost
            if reached is None:
                return None, f"not at r = {line['ratio']:g}: {why}"
            return reached, f"to r = {reached:g}; at {line['ratio']:g}: {why}"
        reached = float(line["ratio"])
    return reached, f"to r = {reached:g}"


def recommended(fixes: pd.DataFrame) -> pd.DataFrame:
    """Per policy, up to which ratio each fix holds and where and why it stops (``holds_to``), and the fix to use: the
    one that holds to the highest ratio at no price (ties: each named), or none; a fix that stops for want of its price
    (its refusal as the uncompressed model's, its price not measured) and ran beyond that ratio is named as not
    known: it might reach further."""
    out = []
    for policy, lines in fixes.groupby("policy", sort=False):
        by_fix = dict(tuple(lines.groupby("fix", sort=False)))
        found = {fix: holds_to(picked) for fix, picked in by_fix.items()}
        reach, said = {fix: r for fix, (r, _) in found.items()}, {fix: text for fix, (_, text) in found.items()}
        best = max((r for r in reach.values() if r is not None), default=None)
        chosen = [fix for fix, r in reach.items() if r is not None and r == best]
        use = " or ".join(chosen) + f" (to r = {best:g})" if chosen else "none: no fix holds at its lowest ratio"
        unknown = [
            f"{fix} (its price not measured from r = {r:g})"
            for fix, picked in by_fix.items()
            if (r := _unpriced(picked, reach[fix])) is not None and (best is None or picked["ratio"].max() > best)
        ]
        if unknown:
            use += "; not known: " + ", ".join(unknown)
        out.append({"policy": reading.label(policy), **{fix: said.get(fix, NOT_MEASURED) for fix in FIXES}, "use": use})
    return pd.DataFrame(out)


def _unpriced(lines: pd.DataFrame, reach: float | None) -> float | None:
    """The ratio where a fix stops for want of its price (its refusal there as the uncompressed model's, its price not
    measured), or None where it stops for a reading."""
    beyond = lines[lines["ratio"] > (reach if reach is not None else -1.0)].sort_values("ratio")
    if beyond.empty:
        return None
    stop = beyond.iloc[0]
    return float(stop["ratio"]) if stop["refusal"] == AS_UNCOMPRESSED and stop["price"] == NOT_MEASURED else None


def figure(fixes: pd.DataFrame, title: str) -> plt.Figure:
    """Per policy (a panel each), each fix at each ratio (a mark, labelled by its ratio): its price (benign queries
    refused, minus the uncompressed model) across, its refusal of the attack (minus the uncompressed model) up, each
    with its 95% interval; the shaded corner is where a fix holds (within the margin of the uncompressed refusal, at no
    price). A fix whose benign side was not measured at a ratio has no mark there."""
    policies = list(dict.fromkeys(fixes["policy"]))
    fig, axes = plt.subplots(1, len(policies), figsize=(3.6 * len(policies), 3.8), squeeze=False, sharey=True)
    margin = reading.RATE_MARGIN
    reach = max(0.1, fixes[["price_low", "price_high"]].abs().max().max()) + 0.03  # every mark and interval shows
    for axis, policy in zip(axes[0], policies):
        axis.axvspan(-1, margin, ymin=0, ymax=1, color="#EEEEEE", zorder=0)
        axis.axhspan(-1, -margin, color="white", zorder=0)
        for fix, lines in fixes[(fixes["policy"] == policy) & fixes["price_change"].notna()].groupby("fix", sort=False):
            x, y = lines["price_change"].to_numpy(), lines["refused_change"].to_numpy()
            axis.errorbar(
                x,
                y,
                xerr=[x - lines["price_low"].to_numpy(), lines["price_high"].to_numpy() - x],
                yerr=[y - lines["refused_low"].to_numpy(), lines["refused_high"].to_numpy() - y],
                fmt=MARKERS[fix],
                color=COLOURS[fix],
                ms=4,
                lw=0.7,
                label=fix,
            )
            for _, line in lines.iterrows():
                axis.annotate(f"{line['ratio']:g}", (line["price_change"], line["refused_change"]), fontsize=6)
        axis.axhline(0, color="grey", lw=0.6, ls=":")
        axis.axvline(0, color="grey", lw=0.6, ls=":")
        axis.set(title=reading.label(policy), xlim=(-reach, reach), ylim=(-1.02, 0.2))
        axis.set_xlabel("price: benign refused minus uncompressed", fontsize=8)
    axes[0, 0].set_ylabel("attack refused minus uncompressed")
    shown = {label: handle for axis in axes[0] for handle, label in zip(*axis.get_legend_handles_labels())}
    fig.legend(
        shown.values(),
        shown.keys(),
        title="fix (by each mark: its ratio)",
        fontsize=8,
        loc="lower center",
        ncol=len(shown),
    )
    fig.subplots_adjust(bottom=0.28)
    suptitle(fig, f"which fix, at what price (shaded: holds, within {margin:g} of the uncompressed model): {title}")
    return fig


BEYOND_PAPER = "not in the paper (arXiv 2605.18053 measured LongBench F1, not refusals)"
BOUNDARY_REFUSAL = Claim(
    "fixes.boundary_refusal",
    "13_fixes",
    f"boundary protection raises the attack's refusal over the base policy at r = {reading.PEAK:g} (boundary minus "
    "base, per prompt, the mean over the five policies)",
    BEYOND_PAPER,
    above=0.0,
    region="a rise: refusal with boundary protection minus refusal of the base policy above 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    status=OURS,
    score="refused",
    cells=(Cells(BOUNDARY, ratios=(0.0, reading.PEAK), queries=("attack",)),),
    mitigation="boundary",
)
CLAIMS = (BOUNDARY_REFUSAL,)
# the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``); cpu: the boundary study's 2,500 attack cells, 41 min
# 31 s measured on 12-07 (the cores shared with a benchmark for half of it), then the price studies' 1,550 benign cells
# (``PRICES``): 950 in 59 min 35 s beside test runs, 400 in 21 min 37 s alone, the base policy's 200 in 31 min 7 s
# beside an audit (12-07; about 12 alone at the 3.5 s a benign cell took here); then the defense last + whitelist's
# 2,500 attack cells (``WHITELIST_LAST``), 34 min 28 s beside test runs, and its 500 benign cells at r = 0.3, 73 min
# 36 s beside audits (12-08; about 29 alone at 3.5 s a cell); ci: 1 min 19 s measured on 12-07
MINUTES = {"ci": 1.3, "cpu": 199}


def _changed(rows: pd.DataFrame, metric: str, ratios) -> tuple[dict, verdicts.Estimate]:
    """Per prompt, ``metric`` pooled over the policies and ``ratios`` (base, boundary), and boundary minus base."""
    levels = {
        v: reading.values(rows, metric, ratios, average=True, variant=v, order="normal") for v in ("base", "boundary")
    }
    return levels, verdicts.difference(levels["boundary"], levels["base"])


def measure(rows: pd.DataFrame) -> dict[str, Measured]:
    """Notebook 13's claims from the boundary study's rows (``analysis.with_benign_flags`` applied), each judged on its
    mechanism as the paper's mitigations are (``mechanism.pooled``, the pooling its number reads)."""
    policies = tuple(p for p in PAPER if p in set(rows.loc[rows["variant"] == "boundary", "policy"]))
    peak = reading.PEAK
    levels, change = _changed(rows[rows["query"] == "attack"], "refused", (peak,))
    refusal = Measured(
        [Part("change", change)],
        f"{verdicts.mean(levels['base'])} -> {verdicts.mean(levels['boundary'])}, change {change.signed()}",
        change.n,
        why=f"at r = {peak:g} the attack is refused {levels['boundary'].mean():.2f} of the time with boundary "
        f"protection, {levels['base'].mean():.2f} without it (the mean over {len(policies)} policies)",
        untestable=reading.no_room(
            verdicts.mean(levels["base"]), 1.0, f"the base policy's refusal rate at r = {peak:g}"
        ),
        mechanism=mechanism.pooled(rows, "boundary", peak, policies),
    )
    return {BOUNDARY_REFUSAL.id: refusal}


def advice(chosen: pd.DataFrame) -> str:
    """The closing answer, per policy, from ``recommended``'s table: the fix to use and up to which ratio, or that
    none holds."""
    lines = [f"- **{line['policy']}**: {line['use']}" for _, line in chosen.iterrows()]
    return (
        "Which fix, per policy (it holds: the attack refused within "
        f"{reading.RATE_MARGIN:g} of the uncompressed model, benign queries refused no more, at every ratio from its "
        "lowest up to the one named):\n\n" + "\n".join(lines)
    )
