"""Notebook 04, Pitfall 5 (Figs 7 and 10, Section 4.5 of arXiv 2510.00231): eviction is biased by position. Which span
each policy keeps at r = 0.5 (``reading.PEAK``), the keep rate of a span being its kept entries over its tokens, per
prompt, compared paired over prompts between the defense and the directive. In the normal order the defense comes
first and the directive later; the flipped order swaps them. StreamingLLM keeps attention sinks and the most recent
window, so on any model it keeps the later span and its bias follows the order: both claims are sanity checks (the
paper's keep rates of StreamingLLM are still compared with ours, as levels the paper gives)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from fairkv.report import verdicts
from fairkv.report.claims import SANITY, Claim, Measured, Number, Part
from fairkv.report.figures import label_policies, span_keep_rates, suptitle
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
    parts="one per model, the study's and the second's where it ran on another (Fig 10): all must hold",
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
    parts="one per model, the study's and the second's where it ran on another (Fig 10): all must hold",
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
    parts="the normal and the flipped order, on each model (the study's and the second's where it ran on another, Fig "
    "10): all must hold",
)

TOVA_DEFENSE = Claim(
    "keep_rates.tova_defense_kept",
    "Fig 7",
    f"TOVA keeps the defense at least as well as the directive though it comes first (within {TOVA_WITHIN:g}, "
    f"normal order, r = {PEAK:g})",
    "TOVA keeps the defense even when it comes first",
    above=-TOVA_WITHIN,
    region=TOVA_REGION,
    parts="one per model, the study's and the second's where it ran on another (Fig 10): all must hold",
    effect=False,
)
CLAIMS = (STREAMING_LATER, STREAMING_REVERSES, KNORM_EARLIER, TOVA_DEFENSE)


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


def _why(claim: Claim, parts: dict[str, list[Part]], whys: dict[str, str]) -> str:
    """The whys of the models whose parts of ``claim`` do not all hold (every model's where all hold)."""
    decided = lambda part: verdicts.decide(part.estimate, above=claim.above, margin=claim.margin)
    failing = [name for name, own in parts.items() if any(decided(part) != verdicts.HOLDS for part in own)]
    return "; ".join(whys[name] for name in failing or parts)


def measure(rows: pd.DataFrame, second: pd.DataFrame | None = None) -> dict[str, Measured]:
    """The claims of notebook 04 from the keep-rate study's rows (both orders, ``reading.PEAK`` among the ratios),
    read on the second model's rows too where it ran (``models``): a part per model, all must hold; the paper's
    numbers are compared with the study's model's."""
    read = models(rows, second)
    on = {name: name if len(read) > 1 else "this model" for name in read}
    suffix = {name: f", {name}" if len(read) > 1 else "" for name in read}
    joined = lambda texts: "; ".join(f"{name}: {t}" if len(read) > 1 else t for name, t in texts.items())
    out = {}
    later = {name: _gap(frame, "streamingllm", "normal", "directive", "defense") for name, frame in read.items()}
    out[STREAMING_LATER.id] = Measured(
        [Part(f"directive - defense{suffix[name]}", gap) for name, (gap, _) in later.items()],
        joined({name: text for name, (_, text) in later.items()}),
        max(gap.n for gap, _ in later.values()),
        {
            "directive": verdicts.mean(_keep(rows, "streamingllm", "normal", "directive")),
            "defense": verdicts.mean(_keep(rows, "streamingllm", "normal", "defense")),
        },
        "; ".join(_lengths_why(frame, on[name]) for name, frame in read.items()),
    )

    reverses = {name: _gap(frame, "streamingllm", "flipped", "defense", "directive") for name, frame in read.items()}
    out[STREAMING_REVERSES.id] = Measured(
        [Part(f"flipped: defense - directive{suffix[name]}", gap) for name, (gap, _) in reverses.items()],
        joined({name: text for name, (_, text) in reverses.items()}),
        max(gap.n for gap, _ in reverses.values()),
        why="; ".join(_favours(frame, "streamingllm", on[name]) for name, frame in read.items()),
    )

    gaps = {
        (name, order): _gap(frame, "knorm", order, *SPANS[order]) for name, frame in read.items() for order in SPANS
    }
    parts = {
        name: [Part(f"{o}: {' - '.join(SPANS[o])}{suffix[name]}", gaps[(name, o)][0]) for o in SPANS] for name in read
    }
    out[KNORM_EARLIER.id] = Measured(
        [part for own in parts.values() for part in own],
        joined({name: "; ".join(f"{o}: {text}" for (n, o), (_, text) in gaps.items() if n == name) for name in read}),
        len(set().union(*(_keep(rows, "knorm", order, "defense").index for order in SPANS))),
        why=_why(KNORM_EARLIER, parts, {name: _favours(frame, "knorm", on[name]) for name, frame in read.items()}),
    )

    kept = {name: _gap(frame, "tova", "normal", "defense", "directive") for name, frame in read.items()}
    parts = {name: [Part(f"defense - directive{suffix[name]}", gap)] for name, (gap, _) in kept.items()}
    out[TOVA_DEFENSE.id] = Measured(
        [part for own in parts.values() for part in own],
        joined({name: text for name, (_, text) in kept.items()}),
        max(gap.n for gap, _ in kept.values()),
        why=_why(TOVA_DEFENSE, parts, {name: _favours(frame, "tova", on[name]) for name, frame in read.items()}),
    )
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
    suptitle(grid.figure, title)
    return grid.figure
