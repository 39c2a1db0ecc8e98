"""Notebook 04, Pitfall 5 (Figs 7 and 10, Section 4.5 of arXiv 2510.00231): eviction is biased by position. Which span
each policy keeps at r = 0.5 (``reading.PEAK``), the keep rate of a span being its kept entries over its tokens, per
prompt, compared paired over prompts between the defense and the directive. In the normal order the defense comes
first and the directive later; the flipped order swaps them. StreamingLLM keeps attention sinks and the most recent
window, so on any model it keeps the later span and its bias follows the order: both claims are sanity checks (the
paper's keep rates of StreamingLLM are still compared with ours, as levels the paper gives)."""

from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from fairkv.report import verdicts
from fairkv.report.claims import FINDING, SANITY, SECOND_MODEL, Claim, Measured, Number, Part
from fairkv.report.figures import BOOTSTRAP_BANDS, label_policies, span_keep_rates, suptitle
from fairkv.report.coverage import Item
from fairkv.runs.studies import BASE, BOTH_ORDERS, TEN_RATIOS, Fields, Scale, Study
from fairkv.studies import reading
from fairkv.studies.reading import PEAK

# keep rates need no decoding, so even the small profiles afford many prompts and all ten ratios
STUDY = Study(
    "keep_rates",
    "04",
    "Pitfall 5: Figs 7, 10",
    Fields(orders=BOTH_ORDERS, variants=BASE, queries=("keep",)),
    {
        "ci": Scale(n_prompts=8, ratios=TEN_RATIOS),
        "cpu": Scale(ratios=TEN_RATIOS),
        "paper": Scale(n_prompts=100),
    },
    figures=("04_fig7_keep_rates", "04_paper_vs_us"),
)
# Fig 10 is Fig 7 on a second model (the paper: Qwen2.5-14B beside Llama-3.1-8B). Keep rates need no instruction
# following, so at the cpu profile the second is SmolLM2-135M, the other embedded model and another architecture
# (Llama's) than Qwen's; at ci it is the profile's own model, so the study shares the first one's rows
SECOND = Study(
    "keep_rates_second",
    "04",
    "Pitfall 5 on a second model: Fig 10",
    Fields(orders=BOTH_ORDERS, variants=BASE, queries=("keep",)),
    {
        "ci": Scale(n_prompts=8, ratios=TEN_RATIOS),
        "cpu": Scale(model="smollm2-135m", ratios=TEN_RATIOS),
        "paper": Scale(model="Qwen/Qwen2.5-14B-Instruct", n_prompts=100),
    },
    figures=("04_fig10_keep_rates",),
)
STUDIES = (STUDY, SECOND)
ITEMS = (  # the paper's items notebook 04 makes (fairkv.report.coverage)
    Item(
        "Fig 7",
        "keep rate of the defense and the directive vs r, both orders",
        ("04_fig7_keep_rates",),
        "our model's keep rates (the paper's Fig 7 is Llama-3.1-8B)",
    ),
    Item(
        "Fig 10",
        "Fig 7 on a second model",
        ("04_fig10_keep_rates",),
        "a second architecture (the paper's is Qwen2.5-14B): keep rates need no instruction following",
    ),
)
# the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``); cpu: Qwen's 9,200 keep-rate rows (5 min), then
# SmolLM2's 9,200 (32 min 38 s measured beside a CI run on 12-04, so about 15 alone: an upper-side estimate)
MINUTES = {"ci": 0.3, "cpu": 20}


SPANS = {"normal": ("defense", "directive"), "flipped": ("directive", "defense")}  # (earlier, later) per order
TOVA_WITHIN = reading.KEEP_MARGIN
TOVA_REGION = (
    f"at least as well: defense minus directive above -{TOVA_WITHIN:g}, the keep-rate margin ({reading.KEEP_NULL}), so "
    "that a defense kept a token or two less than the directive still counts as kept as well"
)

STREAMING_LATER = Claim(
    "keep_rates.streaming_later",
    "Fig 7",
    f"StreamingLLM keeps the later span (the directive) over the defense, normal order, r = {PEAK:g}",
    "directive kept {directive}, defense {defense}",
    {"directive": Number((0.90, 0.95), "keep"), "defense": Number((0.40, 0.50), "keep")},
    above=0.0,
    region="directive minus defense above 0 (StreamingLLM keeps sinks plus the most recent window: true on any model)",
    margin=reading.KEEP_MARGIN,
    null=reading.KEEP_NULL,
    status=SANITY,
)
STREAMING_REVERSES = Claim(
    "keep_rates.streaming_reverses",
    "Fig 7",
    f"the bias reverses when the order flips (StreamingLLM keeps the defense, now later, over the directive, r = "
    f"{PEAK:g})",
    "the bias reverses with the order",
    above=0.0,
    region="flipped order: defense minus directive above 0 (the recent window follows the order: true on any model)",
    margin=reading.KEEP_MARGIN,
    null=reading.KEEP_NULL,
    status=SANITY,
)
KNORM_EARLIER = Claim(
    "keep_rates.knorm_earlier",
    "Fig 7",
    f"K-Norm favours the earlier span in both orders (earlier minus later keep rate, r = {PEAK:g})",
    "K-Norm favours the earlier tokens, whichever span they hold",
    above=0.0,
    region="earlier minus later span above 0",
    margin=reading.KEEP_MARGIN,
    null=reading.KEEP_NULL,
    parts="the normal and the flipped order: both must hold",
)

TOVA_DEFENSE = Claim(
    "keep_rates.tova_defense_kept",
    "Fig 7",
    f"TOVA keeps the defense at least as well as the directive though it comes first (within {TOVA_WITHIN:g}, "
    f"normal order, r = {PEAK:g})",
    "TOVA keeps the defense even when it comes first",
    above=-TOVA_WITHIN,
    region=TOVA_REGION,
    effect=False,
)
PRIMARY = (STREAMING_LATER, STREAMING_REVERSES, KNORM_EARLIER, TOVA_DEFENSE)
# each claim read again on the second model (Fig 10): a line of its own, the paper's findings as SECOND_MODEL lines
ON_SECOND = {claim.id: f"{claim.id}.second_model" for claim in PRIMARY}
CLAIMS = PRIMARY + tuple(
    replace(
        claim,
        id=ON_SECOND[claim.id],
        figure="Fig 10",
        claim=f"{claim.claim}, on the second model",
        paper=claim.paper_text,  # Fig 7's numbers quoted, not sized: they are not the second model's (Fig 10's)
        numbers={},
        status=SECOND_MODEL if claim.status == FINDING else claim.status,
    )
    for claim in PRIMARY
)


def _keep(rows: pd.DataFrame, policy: str, order: str, span: str) -> pd.Series:
    return reading.values(rows, f"keep_{span}", PEAK, policy=policy, order=order, variant="base")


def _gap(rows: pd.DataFrame, policy: str, order: str, first: str, second: str) -> tuple[verdicts.Estimate, str]:
    """``first`` minus ``second`` span's keep rate of ``policy`` in ``order`` at r = 0.5 (paired over prompts), and
    the text."""
    a, b = _keep(rows, policy, order, first), _keep(rows, policy, order, second)
    gap = reading.compared(a, b)
    return gap, f"{first} {verdicts.mean(a)}, {second} {verdicts.mean(b)}, difference {gap.signed()}"


def _favours(rows: pd.DataFrame, policy: str, on: str = "this model") -> str:
    """Which span ``policy`` keeps more in each order at r = 0.5, from the rows, and whether that follows the spans'
    position (the same place wins in both orders) or the spans themselves (the same span wins)."""
    kept = {order: {span: _keep(rows, policy, order, span).mean() for span in SPANS[order]} for order in SPANS}
    more = {order: max(kept[order], key=kept[order].get) for order in SPANS}
    place = {order: "earlier" if more[order] == SPANS[order][0] else "later" for order in SPANS}
    shown = "; ".join(
        f"{order}: " + ", ".join(f"{span} {kept[order][span]:.2f}" for span in SPANS[order]) for order in SPANS
    )
    if place["normal"] == place["flipped"]:
        said = f"keeps the {place['normal']} span more in both orders: position sets what it keeps"
    else:
        said = f"keeps the {more['normal']} more in both orders: the span, not its position, sets what it keeps"
    return f"model: on {on} {reading.label(policy)} {said} ({shown}, r = {PEAK:g})"


def _lengths_why(rows: pd.DataFrame, on: str = "this model") -> str:
    """Why StreamingLLM's keep rates are not the paper's, from the rows: how long the spans are under this model's
    tokenizer (the recent window covers a share of each that depends on it), and the keep rates in both orders."""
    said = _favours(rows, "streamingllm", on)
    if "span_tokens" not in rows or "n_prefix" not in rows:
        return said
    tokens = pd.DataFrame(list(rows["span_tokens"]))
    return (
        f"{said}; under this model's tokenizer the defense is {tokens['defense'].median():g} and the directive "
        f"{tokens['directive'].median():g} tokens of a {rows['n_prefix'].median():g}-token prefix (medians over "
        "prompts), which sets how much of each the recent window covers"
    )


def models(rows: pd.DataFrame, second: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """The rows of each model the claims read, by name: the study's, and the second model's (``SECOND``) where it
    ran on another model (at ci both are the profile's model: its rows once)."""
    name = lambda frame: str(frame["model"].iloc[0]) if "model" in frame else "this model"
    found = {name(rows): rows}
    if second is not None and not second.empty and name(second) not in found:
        found[name(second)] = second
    return found


def _on(frame: pd.DataFrame, on: str, sizes: bool) -> dict[str, Measured]:
    """The claims on one model's rows (``on`` names it in the whys), with our sizes of the paper's numbers where
    ``sizes`` (the study's model: the paper's numbers are Fig 7's, not Fig 10's)."""
    out = {}
    gap, text = _gap(frame, "streamingllm", "normal", "directive", "defense")
    kept = {span: verdicts.mean(_keep(frame, "streamingllm", "normal", span)) for span in ("directive", "defense")}
    out[STREAMING_LATER.id] = Measured(
        [Part("directive - defense", gap)], text, gap.n, kept if sizes else {}, _lengths_why(frame, on)
    )
    gap, text = _gap(frame, "streamingllm", "flipped", "defense", "directive")
    out[STREAMING_REVERSES.id] = Measured(
        [Part("flipped: defense - directive", gap)], text, gap.n, why=_favours(frame, "streamingllm", on)
    )
    gaps = {order: _gap(frame, "knorm", order, *SPANS[order]) for order in SPANS}
    out[KNORM_EARLIER.id] = Measured(
        [Part(f"{o}: {' - '.join(SPANS[o])}", gaps[o][0]) for o in SPANS],
        "; ".join(f"{o}: {text}" for o, (_, text) in gaps.items()),
        len(set().union(*(_keep(frame, "knorm", order, "defense").index for order in SPANS))),
        why=_favours(frame, "knorm", on),
    )
    gap, text = _gap(frame, "tova", "normal", "defense", "directive")
    out[TOVA_DEFENSE.id] = Measured([Part("defense - directive", gap)], text, gap.n, why=_favours(frame, "tova", on))
    return out


def measure(rows: pd.DataFrame, second: pd.DataFrame | None = None) -> dict[str, Measured]:
    """The claims of notebook 04 from the keep-rate study's rows (both orders, ``reading.PEAK`` among the ratios),
    each read again on the second model's rows where it ran on another model (``models``): a line per model, the
    second's under its own id (``ON_SECOND``), so that no verdict on the study's model rests on the second's rows;
    the paper's numbers are compared with the study's model's."""
    read = models(rows, second)
    (first, frame), *others = read.items()
    out = _on(frame, first if others else "this model", sizes=True)
    for name, other in others:
        out.update({ON_SECOND[claim_id]: m for claim_id, m in _on(other, name, sizes=False).items()})
    return out


def keep_rate_figure(rows: pd.DataFrame, title: str) -> plt.Figure:
    """Figs 7 and 10: keep rate of the defense and the directive span vs r; columns policies, rows orders."""
    long = span_keep_rates(label_policies(rows), ["key", "policy", "order", "ratio"])
    grid = sns.relplot(
        data=long,
        x="ratio",
        y="keep rate",
        hue="span",
        col="policy",
        row="order",
        kind="line",
        marker="o",
        errorbar=("ci", 95),
        n_boot=1000,
        seed=0,
        height=2.5,
        aspect=1.0,
    )
    grid.set_axis_labels("compression ratio r", "keep rate")
    grid.set_titles("{col_name}, {row_name} order")
    suptitle(grid.figure, f"{title}; {BOOTSTRAP_BANDS}")
    return grid.figure
