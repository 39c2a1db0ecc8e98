"""Runtime of the mitigations (Appendix K, Figs 23-24): compression and decoding cost of each policy's base, whitelist
and fair variants, measured side by side in one process.

The paper times, on one GPU, the compression (prefill with the press) and the decoding of 256 new tokens for H2O,
H2O + whitelist and H2O + fair across r, and reports seconds per 100 tokens: compression about 0.06 s (default),
0.065 (fair), 0.08 (whitelist); decoding about 0.030 s for all, within 7%. Absolute times depend on the machine, so
the headline here is the ratio of each variant to its base policy at the same r.

Protocol: ``warmup`` untimed rounds, then ``repeats`` rounds; in each round every (prompt, policy, ratio, variant) is
measured once, variants interleaved, so drift of the machine (clock, cache, other load) falls on all variants alike.
Compression is the real path (``generation.compress``: prefill under the kvpress press, as the paper measures it);
decoding runs exactly ``new_tokens`` tokens at batch size 1 (no stop at end of turn: equal work per variant).

Timings are stored like any other rows (``timings``: ``results/<profile>/runtime_<model>.csv``, the plan beside each
row), so re-rendering notebook 09 reads the measured rounds and gives the same claims on any machine and load; they are
measured again only when asked (``remeasure``) or when the stored ones belong to another plan.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from fairkv.core import data, generation, models, paths, prompts
from fairkv.core.presses import MITIGATIONS, Setting
from fairkv.core.progress import Bar
from fairkv.core.prompts import Prompt


@dataclass(frozen=True)
class Plan:
    """What notebook 09 measures at a profile's scale (``fairkv.studies.runtime.STUDY``'s)."""

    model: str
    policies: tuple[str, ...] = ("h2o",)
    ratios: tuple[float, ...] = (0.25, 0.5, 0.75)
    n_prompts: int = 1
    repeats: int = 3
    new_tokens: int = 16
    dtype: str = "float32"  # the model's precision (the sweeps' profile precision, so the times are theirs)
    note: str = ""


def stored(chosen: Plan, profile: str) -> Path:
    """Where ``profile``'s timings of ``chosen.model`` are kept."""
    return paths.results_dir() / profile / f"runtime_{chosen.model.replace('/', '__')}.csv"


def timings(chosen: Plan, profile: str, remeasure: bool = False, progress: bool = True) -> pd.DataFrame:
    """The plan's timings: read from ``stored`` when they were measured for this very plan, else measured now (and
    when ``remeasure``) and stored. Says which."""
    path = stored(chosen, profile)
    key = json.dumps({k: v for k, v in asdict(chosen).items() if k != "note"}, sort_keys=True)
    if path.exists() and not remeasure:
        kept = pd.read_csv(path)
        if set(kept["plan"]) == {key}:
            print(
                f"timings: {(~kept['warmup']).sum()} timed measurements read from {path.name} (measured "
                f"{kept['measured'].iloc[0]}; remeasure=True times them again)"
            )
            return kept.drop(columns=["plan", "measured"])
        print(f"timings: {path.name} holds another plan's timings: measuring this plan's")
    paths.refuse_if_frozen(
        f"the timings of {chosen} are not stored in {path}" if not remeasure else "remeasure=True times again",
        "Run without --frozen to measure them, or restore the committed timings (git checkout results/).",
    )
    measured = run(chosen, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    measured.assign(plan=key, measured=pd.Timestamp.now(tz="UTC").strftime("%Y-%m-%d %H:%M UTC")).to_csv(
        path, index=False
    )
    print(f"timings: measured now, stored in {path.name}")
    return measured


def run(chosen: Plan, progress: bool = True) -> pd.DataFrame:
    """Load the plan's model and its first prompts of sys_ifeval_shuffled (the paper's prompt) and measure."""
    lm = models.load_model(chosen.model, dtype=getattr(torch, chosen.dtype), device=models.default_device())
    templates = data.load_defense_templates()
    records = data.load_sys_ifeval("sys_ifeval_shuffled", limit=chosen.n_prompts)
    cases = [(prompts.paper_prompt(lm.tokenizer, record, templates), record.user) for record in records]
    return measure(
        lm,
        cases,
        chosen.policies,
        chosen.ratios,
        repeats=chosen.repeats,
        new_tokens=chosen.new_tokens,
        progress=progress,
    )


def measure(  # 9 parameters: notebook 09's, each a parameter of it
    lm: models.LoadedModel,
    cases: list[tuple[Prompt, str]],
    policies=("h2o",),
    ratios=(0.25, 0.5, 0.75),
    variants=MITIGATIONS,
    repeats: int = 5,
    warmup: int = 1,
    new_tokens: int = 64,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (round, prompt, policy, ratio, variant): prefix tokens, compression and decoding seconds.
    ``cases`` are (prompt, user query) pairs; rounds < 0 are the warm-up (kept in the frame, flagged)."""
    rows = []
    work = [(i, c, p, r, v) for i, c in enumerate(cases) for p in policies for r in ratios for v in variants]
    rounds = range(-warmup, repeats)
    with Bar(total=len(rounds) * len(work), desc="timings", disable=not progress) as bar:
        for round_ in rounds:
            for index, (prompt, query), policy, ratio, variant in work:
                compressed = generation.compress(lm, prompt, Setting(policy, ratio=ratio, variant=variant))
                reply = generation.answer(lm, compressed, prompt.query_ids(query), new_tokens, stop_at_eos=False)
                rows.append(
                    {
                        "round": round_,
                        "warmup": round_ < 0,
                        "prompt": index,
                        "policy": policy,
                        "ratio": ratio,
                        "variant": variant,
                        "n_prefix": prompt.n_tokens,
                        "compress_s": compressed.seconds,
                        "new_tokens": reply.n_tokens,
                        "decode_s": reply.seconds,
                    }
                )
                bar.update()
    return pd.DataFrame(rows)


def per_100(timings: pd.DataFrame) -> pd.DataFrame:
    """The timed rounds with compression seconds per 100 prefix tokens, decoding seconds per 100 new tokens and
    decoding throughput (tokens/s)."""
    return timings[~timings["warmup"]].assign(
        compress_per_100=lambda t: 100 * t["compress_s"] / t["n_prefix"],
        decode_per_100=lambda t: 100 * t["decode_s"] / t["new_tokens"],
        throughput=lambda t: t["new_tokens"] / t["decode_s"],
    )


def summarise(timings: pd.DataFrame) -> pd.DataFrame:
    """Per (policy, ratio, variant) over the timed rounds: medians and interquartile ranges of compression seconds
    per 100 prefix tokens and decoding seconds per 100 new tokens, decoding throughput (tokens/s), and each median
    as a ratio to the base variant's at the same policy and ratio."""
    timed = per_100(timings)
    keys = ["policy", "ratio", "variant"]
    grouped = timed.groupby(keys)
    table = pd.DataFrame({"n": grouped.size()})
    for column in ("compress_per_100", "decode_per_100", "throughput"):
        table[column] = grouped[column].median()
        table[f"{column}_iqr"] = grouped[column].quantile(0.75) - grouped[column].quantile(0.25)
    table = table.reset_index()
    base = table[table["variant"] == "base"].set_index(["policy", "ratio"])
    for column in ("compress_per_100", "decode_per_100", "throughput"):
        reference = base[column].reindex(pd.MultiIndex.from_frame(table[["policy", "ratio"]])).to_numpy()
        table[f"{column}_vs_base"] = table[column] / reference
    return table


def headline(summary: pd.DataFrame) -> pd.DataFrame:
    """Ratio to base per policy and variant, as the median over ratios (the number the notebook leads with)."""
    ratios = ["compress_per_100_vs_base", "decode_per_100_vs_base", "throughput_vs_base"]
    return summary.groupby(["policy", "variant"])[ratios].median().round(3)
