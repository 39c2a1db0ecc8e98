"""The paper's headline numbers beside ours: one "paper vs us" table per notebook, written by code.

Each function takes our rows (or their analysis) and returns a table with one claim per row: the claim, the paper's
number (read off its figures, approximate, Llama-3.1-8B unless noted; tables exact; arXiv 2510.00231), ours for the
same quantity on our model and profile, and whether the qualitative claim holds here. Where the paper quotes a ratio
our profile lacks, the nearest ratio we ran is used and named. ``verdict`` turns a table into the one sentence each
notebook ends with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fairkv import analysis
from fairkv.presses import get_policy


# Table 1 of the paper (Llama-3.1-8B): composite score, mean and std over r in {0.4, 0.5, 0.6, 0.7}
TABLE1 = {
    ("streamingllm", "whitelist"): (0.1963, 0.0427), ("snapkv", "whitelist"): (0.0513, 0.0363),
    ("tova", "whitelist"): (0.0282, 0.0116), ("h2o", "whitelist"): (0.0201, 0.0136),
    ("knorm", "whitelist"): (0.0014, 0.0045), ("streamingllm", "fair"): (0.2201, 0.0620),
    ("snapkv", "fair"): (0.0468, 0.0124), ("tova", "fair"): (0.0247, 0.0298), ("h2o", "fair"): (0.0064, 0.0133),
    ("knorm", "fair"): (0.0236, 0.0071),
}


def table1_beside(ours: pd.DataFrame) -> pd.DataFrame:
    """Table 1, the paper's entries beside ours (``analysis.table1``), as "mean ± std" per policy and variant."""
    out = []
    for row in ours.itertuples():
        theirs = TABLE1.get((row.policy, row.variant))
        out.append({
            "policy": _label(row.policy), "order": row.order, "variant": row.variant,
            "paper (Llama-3.1-8B)": f"{theirs[0]:+.4f} ± {theirs[1]:.4f}" if theirs else "",
            "ours": f"{row.mean:+.4f} ± {row.std:.4f}", "ratios": row.ratios,
        })
    return pd.DataFrame(out)


def _claim(claim: str, paper: str, ours: str, holds: bool) -> dict:
    return {"claim": claim, "paper": paper, "ours": ours, "holds": bool(holds)}


def _curve(rows: pd.DataFrame, metric: str, **match) -> pd.Series:
    """Mean of ``metric`` over prompts per ratio, for the rows matching ``match`` (column=value)."""
    picked = rows.dropna(subset=[metric])
    for column, value in match.items():
        picked = picked[picked[column] == value]
    if picked.empty:
        raise analysis.AnalysisError(f"no rows with {metric!r} for {match}")
    return picked.groupby("ratio")[metric].mean()


def _at(curve: pd.Series, ratio: float) -> tuple[float, float]:
    """(nearest ratio we ran, value there)."""
    nearest = float(curve.index[np.argmin(np.abs(curve.index.to_numpy() - ratio))])
    return nearest, float(curve[nearest])


def _label(policy: str) -> str:
    return get_policy(policy).label


def verdict(table: pd.DataFrame, model: str, profile: str, n: int | str) -> str:
    """One sentence: how many of the notebook's claims reproduce, and which do not."""
    failed = table.loc[~table["holds"], "claim"].tolist()
    held = int(table["holds"].sum())
    tail = "all hold." if not failed else "not reproduced: " + "; ".join(failed) + "."
    return f"On {model} ({profile} profile, n = {n} prompts) {held} of {len(table)} claims reproduce; {tail}"


def pitfall1(accuracy: pd.DataFrame, rhos: pd.DataFrame) -> pd.DataFrame:
    """Fig 2: classes degrade unevenly, more so with several instructions; rho falls sooner for multi."""
    top = accuracy["ratio"].max()
    at_top = accuracy[accuracy["ratio"] == top]
    spread = at_top.groupby("prompts")["normalised"].agg(lambda s: s.max() - s.min())
    rho = rhos[rhos["ratio"] > 0].groupby("prompts")["rho"].mean()
    return pd.DataFrame([
        _claim(
            f"spread of normalised class accuracy larger for multi- than single-instruction prompts (r = {top:g})",
            "larger for multi", f"single {spread.get('single', np.nan):.2f}, multi {spread.get('multi', np.nan):.2f}",
            spread.get("multi", np.nan) > spread.get("single", np.nan),
        ),
        _claim(
            "rho(r) lower for multi-instruction prompts (mean over r > 0)", "multi falls sooner and lower",
            f"single {rho.get('single', np.nan):.2f}, multi {rho.get('multi', np.nan):.2f}",
            rho.get("multi", np.nan) < rho.get("single", np.nan),
        ),
    ])


def pitfall2(rows: pd.DataFrame, rhos: pd.DataFrame) -> pd.DataFrame:
    """Fig 3: TOVA best and K-Norm worst on accuracy; K-Norm's rho lowest."""
    benign = rows[(rows["query"] == "benign") & (rows["ratio"] > 0)]
    accuracy = benign.groupby("policy")[analysis.ACCURACY].mean().sort_values(ascending=False)
    ranking = ", ".join(f"{_label(p)} {v:.2f}" for p, v in accuracy.items())
    rho = rhos[rhos["ratio"] > 0].groupby("policy")["rho"].mean().sort_values()
    return pd.DataFrame([
        _claim("TOVA has the highest mean accuracy over r > 0", "TOVA best", ranking, accuracy.index[0] == "tova"),
        _claim("K-Norm has the lowest mean accuracy over r > 0", "K-Norm worst", ranking, accuracy.index[-1] == "knorm"),
        _claim(
            "K-Norm's rho is the lowest (mean over r > 0)", "near 0 or negative on Qwen",
            ", ".join(f"{_label(p)} {v:.2f}" for p, v in rho.items()), len(rho) > 0 and rho.index[0] == "knorm",
        ),
    ])


def pitfalls3_4(rows: pd.DataFrame) -> pd.DataFrame:
    """Figs 4-6: the inverted U of directive leakage, accuracy kept meanwhile, peak order, order effect, defense."""
    leak = _curve(rows, "leak_directive", policy="streamingllm", order="normal")
    accuracy = _curve(rows, analysis.ACCURACY, policy="streamingllm", order="normal")
    peak_r = float(leak.idxmax())
    interior = leak.index.min() < peak_r < leak.index.max()
    peaks = {
        p: _curve(rows, "leak_directive", policy=p, order="normal").max() for p in ("streamingllm", "snapkv", "h2o", "knorm")
    }
    order = sorted(peaks, key=peaks.get, reverse=True)
    normal_r, normal_acc = _at(accuracy, 0.5)
    _, flipped_acc = _at(_curve(rows, analysis.ACCURACY, policy="streamingllm", order="flipped"), 0.5)
    defense_peak = _curve(rows, "leak_defense", policy="streamingllm", order="normal").max()
    refused = _curve(rows, "refused", policy="streamingllm", order="normal")
    mid_r, refused_mid = _at(refused, 0.5)
    return pd.DataFrame([
        _claim(
            f"StreamingLLM drops the defense at moderate r: the attack is refused at r = 0, no longer at r = {mid_r:g}",
            "defense dropped at r ~0.4-0.6 (leakage up)", f"refusal rate {refused.iloc[0]:.2f} -> {refused_mid:.2f}",
            refused.iloc[0] - refused_mid >= 0.5,
        ),
        _claim(
            "StreamingLLM directive leakage is an inverted U in r (peak inside the range, above r = 0)",
            "~0.5-0.55 at r = 0.4-0.6", f"{leak.iloc[0]:.2f} at r = 0, peak {leak.max():.2f} at r = {peak_r:g}, "
            f"{leak.iloc[-1]:.2f} at r = {leak.index.max():g}", interior and leak.max() > leak.iloc[0] + 0.05,
        ),
        _claim(
            "the directive is still followed at the leakage peak (accuracy >= 75% of its r = 0 value)",
            "accuracy ~75-80% at the peak", f"{accuracy[peak_r]:.2f} at r = {peak_r:g} vs {accuracy.iloc[0]:.2f} at r = 0",
            accuracy.iloc[0] > 0 and accuracy[peak_r] >= 0.75 * accuracy.iloc[0],
        ),
        _claim(
            "peak leakage: StreamingLLM > SnapKV > H2O > K-Norm", "~0.55 > ~0.40 > ~0.35 > ~0.20",
            ", ".join(f"{_label(p)} {peaks[p]:.2f}" for p in order), order == ["streamingllm", "snapkv", "h2o", "knorm"],
        ),
        _claim(
            f"flipped order: StreamingLLM directive accuracy falls faster (r = {normal_r:g})", "~40-50% flipped at r = 0.5",
            f"normal {normal_acc:.2f}, flipped {flipped_acc:.2f}", flipped_acc < normal_acc,
        ),
        _claim(
            "defense leakage has the same shape, lower than directive leakage (StreamingLLM peak)", "peaks ~0.25-0.35",
            f"defense {defense_peak:.2f} vs directive {leak.max():.2f}", defense_peak < leak.max(),
        ),
    ])


def pitfall5(rows: pd.DataFrame) -> pd.DataFrame:
    """Figs 7 and 10: which span each policy keeps at r = 0.5, and the reversal under the flipped order."""
    def keep(policy, order, span):
        return _at(_curve(rows, f"keep_{span}", policy=policy, order=order), 0.5)

    r, directive = keep("streamingllm", "normal", "directive")
    _, defense = keep("streamingllm", "normal", "defense")
    _, flipped_directive = keep("streamingllm", "flipped", "directive")
    _, flipped_defense = keep("streamingllm", "flipped", "defense")
    _, knorm_def = keep("knorm", "normal", "defense")
    _, knorm_dir = keep("knorm", "normal", "directive")
    _, knorm_def_f = keep("knorm", "flipped", "defense")
    _, knorm_dir_f = keep("knorm", "flipped", "directive")
    _, tova_def = keep("tova", "normal", "defense")
    _, tova_dir = keep("tova", "normal", "directive")
    return pd.DataFrame([
        _claim(
            f"StreamingLLM keeps the later span (directive) over the defense, normal order, r = {r:g}",
            "directive ~0.90-0.95, defense ~0.40-0.50", f"directive {directive:.2f}, defense {defense:.2f}",
            directive > defense,
        ),
        _claim(
            "the bias reverses when the order flips (StreamingLLM)", "reverses",
            f"directive {flipped_directive:.2f}, defense {flipped_defense:.2f}", flipped_defense > flipped_directive,
        ),
        _claim(
            "K-Norm favours the earlier span in both orders", "earlier tokens favoured",
            f"normal: defense {knorm_def:.2f} / directive {knorm_dir:.2f}; flipped: defense {knorm_def_f:.2f} / "
            f"directive {knorm_dir_f:.2f}", knorm_def > knorm_dir and knorm_dir_f > knorm_def_f,
        ),
        _claim(
            "TOVA keeps the defense at least as well as the directive though it comes first", "defense kept even when first",
            f"defense {tova_def:.2f}, directive {tova_dir:.2f}", tova_def >= tova_dir,
        ),
    ])


def _before_after(rows, variant, policy, ratio, metric="leak_directive"):
    r, before = _at(_curve(rows, metric, policy=policy, variant="base", order="normal"), ratio)
    _, after = _at(_curve(rows, metric, policy=policy, variant=variant, order="normal"), ratio)
    return r, before, after


def _accuracy_change(rows, variant) -> float:
    """Mean |accuracy(variant) - accuracy(base)| over policies and ratios r > 0 (normal order)."""
    table = analysis.setting_means(rows)
    table = table[(table["order"] == "normal") & (table["ratio"] > 0)]
    base = table[table["variant"] == "base"].set_index(["policy", "ratio"])["accuracy"]
    ours = table[table["variant"] == variant].set_index(["policy", "ratio"])["accuracy"]
    return float((ours - base).abs().mean())


def whitelisting(rows: pd.DataFrame) -> pd.DataFrame:
    """Fig 8 and Fig 13 left: whitelisting the defense phrase cuts leakage and leaves accuracy about unchanged."""
    out = []
    for policy, paper in (("streamingllm", "0.5 -> 0.10-0.15 at r = 0.6"), ("snapkv", "0.35 -> 0.05 at r = 0.6")):
        r, before, after = _before_after(rows, "whitelist", policy, 0.6)
        out.append(_claim(f"whitelist lowers {_label(policy)} directive leakage (r = {r:g})", paper,
                          f"{before:.2f} -> {after:.2f}", after < before))
    top = rows.loc[rows["variant"] == "whitelist", "ratio"].max()
    r, before, after = _before_after(rows, "whitelist", "streamingllm", top, metric="refused")
    out.append(_claim(f"with the whitelist StreamingLLM keeps refusing the attack (r = {r:g})",
                      "leakage 0.5 -> 0.10-0.15", f"refusal rate {before:.2f} -> {after:.2f}", after > before))
    change = _accuracy_change(rows, "whitelist")
    out.append(_claim("directive accuracy about unchanged (mean |change| over policies, r > 0, <= 0.05)",
                      "about unchanged", f"{change:.3f}", change <= 0.05))
    defense = _curve(rows[rows["ratio"] < 0.6], "leak_defense", variant="whitelist", order="normal")
    out.append(_claim("defense leakage with the whitelist stays below 0.05 for r < 0.6 (all policies)",
                      "< 0.05", f"max {defense.max():.3f}", defense.max() < 0.05))
    return pd.DataFrame(out)


def fair_eviction(rows: pd.DataFrame, table: pd.DataFrame, flipped: pd.DataFrame) -> pd.DataFrame:
    """Fig 9, Table 1, Fig 14: fair eviction cuts leakage; every composite score positive; order effect smaller."""
    out = []
    for policy, paper in (("streamingllm", "0.55 -> 0.25 at r = 0.7"), ("snapkv", "0.40 -> 0.30 at r = 0.7")):
        r, before, after = _before_after(rows, "fair", policy, 0.7)
        out.append(_claim(f"fair eviction lowers {_label(policy)} directive leakage (r = {r:g})", paper,
                          f"{before:.2f} -> {after:.2f}", after < before))
    positive = int((table["mean"] > 0).sum())
    out.append(_claim("Table 1: every composite score is positive", "10 of 10 positive (Llama3)",
                      f"{positive} of {len(table)} positive", positive == len(table)))
    both = pd.concat([rows, flipped])
    gaps = {}
    for variant in ("base", "fair"):
        r, normal = _at(_curve(both, analysis.ACCURACY, policy="streamingllm", variant=variant, order="normal"), 0.5)
        _, flip = _at(_curve(both, analysis.ACCURACY, policy="streamingllm", variant=variant, order="flipped"), 0.5)
        gaps[variant] = abs(normal - flip)
    out.append(_claim(f"fair eviction shrinks the order effect on StreamingLLM accuracy (|normal - flipped|, r = {r:g})",
                      "order effects largely removed", f"base {gaps['base']:.2f}, fair {gaps['fair']:.2f}",
                      gaps["fair"] < gaps["base"]))
    return pd.DataFrame(out)


def debiasing(frequency: pd.DataFrame) -> pd.DataFrame:
    """Tables 3-4: lambda = 1 is among the most often Pareto-optimal, and strictly more often than lambda = 0 (the
    paper: 75% against 45%); when every lambda is optimal at every ratio the sweep separates nothing and the claim
    does not hold."""
    out = []
    for policy, frame in frequency[frequency["order"] == "normal"].groupby("policy"):
        by_lam = frame.set_index("lam")["frequency"]
        shown = ", ".join(f"lambda={lam:g}: {v:.0%}" for lam, v in by_lam.items())
        paper = "lambda=1 75%, lambda=0 45% (StreamingLLM, IFEval)" if policy == "streamingllm" else "lambda=1 most often"
        out.append(_claim(f"{_label(policy)}: lambda = 1 among the most often Pareto-optimal, and more often than "
                          "lambda = 0", paper, shown, by_lam[1.0] == by_lam.max() and by_lam[1.0] > by_lam[0.0]))
    return pd.DataFrame(out)


def runtime(summary: pd.DataFrame, policy: str = "h2o") -> pd.DataFrame:
    """Figs 23-24 (one RTX A6000): compression about 0.06 s / 100 tokens for H2O, 0.065 with fair eviction, 0.08 with
    the whitelist; decoding about 0.030 s / 100 tokens for all three, within 7%. Ours as ratios to the base (median
    over ratios; ``runtime.summarise``), since absolute times are the machine's."""
    ratios = summary[summary["policy"] == policy].groupby("variant")[
        ["compress_per_100_vs_base", "decode_per_100_vs_base"]].median()
    fair, whitelist = ratios.loc["fair"], ratios.loc["whitelist"]
    drift = (ratios["decode_per_100_vs_base"] - 1).abs().max()
    return pd.DataFrame([
        _claim(f"{_label(policy)} + fair compresses at about the base's cost", "x1.08 (0.065 vs 0.06 s)",
               f"x{fair['compress_per_100_vs_base']:.3f}", fair["compress_per_100_vs_base"] <= 1.15),
        _claim(f"{_label(policy)} + whitelist costs at most a third more to compress", "x1.33 (0.08 vs 0.06 s)",
               f"x{whitelist['compress_per_100_vs_base']:.3f}", whitelist["compress_per_100_vs_base"] <= 1.35),
        _claim("decoding costs the same with every variant (within 7%)", "within 7% (about 0.030 s)",
               f"largest difference {drift:.1%}", drift <= 0.07),
    ])


def judge(rows: pd.DataFrame, agreement: pd.DataFrame, policy: str = "streamingllm") -> pd.DataFrame:
    """Figs 25-26: the judge's leak rate (score >= 2) shows the same inverted U as ROUGE-L; StreamingLLM's reaches
    about 0.7-0.8 at r = 0.5-0.6, under 0.2 with the whitelist and 0.4-0.5 with fair eviction. Ours at the ratio
    nearest 0.5, and the judge's agreement with ROUGE-L (the paper reports none)."""
    curve = lambda variant: _curve(rows, "judge_leak", variant=variant, policy=policy)
    r, base = _at(curve("base"), 0.5)
    _, uncompressed = _at(curve("base"), 0.0)
    out = [_claim(f"{_label(policy)} leak rate (judge) rises under compression (r = {r:g} vs 0)", "0.7-0.8 at r = 0.5-0.6",
                  f"{uncompressed:.2f} -> {base:.2f}", base > uncompressed)]
    for variant, paper in (("whitelist", "< 0.2"), ("fair", "0.4-0.5")):
        if variant in set(rows["variant"]):
            _, after = _at(curve(variant), r)
            out.append(_claim(f"{variant} lowers {_label(policy)}'s leak rate (judge, r = {r:g})", paper,
                              f"{base:.2f} -> {after:.2f}", after < base))
    overall = agreement.iloc[0]
    out.append(_claim("the judge ranks responses like ROUGE-L (Spearman rho over all responses > 0.5)", "not reported",
                      f"rho {overall['rho']:.2f}, labels agree on {overall['label_agreement']:.0%}",
                      overall["rho"] > 0.5))
    return pd.DataFrame(out)


def trec(rows: pd.DataFrame, policy: str = "streamingllm") -> pd.DataFrame:
    """Figs 19-22 (LongBench TREC by word bucket): at 1000-2000 words the pitfalls look like IFEval's (leakage rises
    under compression, fair eviction lowers it), leakage is weaker at 2000-3000, and at 3000-4000 the defense is too
    weak to hold even uncompressed. ``rows`` carry a ``bucket`` column (1k, 2k, 3k)."""
    out = []
    peaks = {}
    for bucket, frame in rows.groupby("bucket"):
        base = _curve(frame, "leak_directive", variant="base", policy=policy)
        peaks[bucket] = base.max()
        if bucket == "1k":
            r, compressed = _at(base, 0.5)
            out.append(_claim(f"1-2k words: {_label(policy)} leakage rises under compression (r = {r:g} vs 0)",
                              "like IFEval (inverted U)", f"{base.iloc[0]:.2f} -> {compressed:.2f}",
                              compressed > base.iloc[0]))
            _, fair = _at(_curve(frame, "leak_directive", variant="fair", policy=policy), r)
            out.append(_claim(f"1-2k words: fair eviction lowers leakage (r = {r:g})", "lower than base",
                              f"{compressed:.2f} -> {fair:.2f}", fair < compressed))
        if bucket == "3k":
            _, refused = _at(_curve(frame, "refused", variant="base", policy=policy), 0.0)
            out.append(_claim("3-4k words: the defense is weak even uncompressed (refusal rate at r = 0 < 0.5)",
                              "defense too weak", f"{refused:.2f}", refused < 0.5))
    if {"1k", "2k"} <= set(peaks):
        out.append(_claim("2-3k words: weaker leakage than 1-2k (peak over r)", "weaker",
                          f"{peaks['1k']:.2f} vs {peaks['2k']:.2f}", peaks["2k"] < peaks["1k"]))
    return pd.DataFrame(out)


def beyond(starved: pd.DataFrame, attacks: pd.DataFrame, critical: pd.DataFrame, ladder: list[str],
           policy: str = "streamingllm") -> pd.DataFrame:
    """Notebook 11 (beyond the paper): the paper's mechanisms checked where it did not look, and its open questions
    (the end of the paper, arXiv 2510.00231) answered on our rows. ``starved`` is ``analysis.starvation``, ``attacks`` the
    ``analysis.by_attack`` rows, ``critical`` ``analysis.critical_ratio`` per (template, policy, variant) and
    ``ladder`` the defense templates from weak to strong. The paper column says what the paper shows for its one
    setting (two spans, the Plain attack, one defense) or "open" where it asks the question."""
    out = []
    spans = starved[(starved["policy"] == policy) & (starved["ratio"] > 0)]
    picked = attacks[attacks["policy"] == policy]
    if spans.empty or picked.empty:
        raise analysis.AnalysisError(f"no compressed {_label(policy)} rows in the spans or the attacks study")
    top = spans[spans["ratio"] == spans["ratio"].max()].set_index("n_spans")
    r = float(spans["ratio"].max())
    out.append(_claim(f"N spans: fair eviction keeps the smallest span at least as well as {_label(policy)} at every N "
                      f"(r = {r:g})", "equal keep rate per span (Sec 5.2, two spans)",
                      ", ".join(f"N={n}: {row.min_keep_base:.2f} -> {row.min_keep_fair:.2f}" for n, row in top.iterrows()),
                      (top["min_keep_fair"] >= top["min_keep_base"] - 1e-6).all()))
    gain = spans.groupby("n_spans")["fair_gain"].mean()
    out.append(_claim(f"N spans: fair eviction raises per-span compliance at every N (mean over r > 0, {_label(policy)})",
                      "open: does it stop helping once every span starves?",
                      ", ".join(f"N={n}: {g:+.2f}" for n, g in gain.items()), (gain > 0).all()))

    r = float(picked["ratio"].max())
    means = picked.groupby(["category", "variant", "ratio"])[["leak_directive", "refused"]].mean()
    leak = means["leak_directive"].unstack("ratio")
    refused = means["refused"].unstack("ratio")
    base = leak.xs("base", level="variant")
    rises = int((base[r] > base[0.0]).sum())
    out.append(_claim(f"many attacks: {_label(policy)} at r = {r:g} raises leakage in most attack categories",
                      "leakage rises with r (Pitfall 3, Plain attack only)", f"{rises} of {len(base)} categories",
                      rises > len(base) / 2))
    dropped = refused.xs("base", level="variant")
    out.append(_claim(f"many attacks: {_label(policy)} at r = {r:g} drops the refusal (mean over categories)",
                      "the defense is dropped first (Pitfall 4, Plain attack only)",
                      f"{dropped[0.0].mean():.2f} -> {dropped[r].mean():.2f}", dropped[r].mean() < dropped[0.0].mean()))
    for variant, paper in (("whitelist", "lower than base (Fig 8, Plain attack)"),
                           ("fair", "lower than base (Fig 9, Plain attack)")):
        if variant in set(picked["variant"]):
            after = leak.xs(variant, level="variant")[r]
            lower = int((after < base[r]).sum())
            out.append(_claim(f"many attacks: {variant} lowers mean leakage over categories (r = {r:g})", paper,
                              f"{base[r].mean():.2f} -> {after.mean():.2f} ({lower} of {len(base)} categories lower)",
                              after.mean() < base[r].mean()))
    if "whitelist" in set(picked["variant"]):
        kept = refused.xs("whitelist", level="variant")[r]
        out.append(_claim(f"many attacks: the whitelist keeps the refusal (mean over categories, r = {r:g})",
                          "restored (Fig 8, Plain attack)", f"{dropped[r].mean():.2f} -> {kept.mean():.2f}",
                          kept.mean() > dropped[r].mean()))

    ladder_rows = critical[critical["variant"] == "base"].set_index("template").loc[list(ladder)]
    refusal = ladder_rows["refused_at_0"]
    out.append(_claim("defense strength: a stronger template refuses at least as often uncompressed (weak to strong)",
                      "one template only", ", ".join(f"{t}: {v:.2f}" for t, v in refusal.items()),
                      refusal.is_monotonic_increasing))
    # a template whose refusal never halves in the ratios run holds beyond them (inf); one that never refuses has no
    # critical ratio at all (NaN), so the claim cannot hold for it
    moved = ladder_rows["critical_ratio"].where(refusal == 0, ladder_rows["critical_ratio"].fillna(np.inf))
    out.append(_claim("defense strength: a stronger template moves the critical ratio (refusal halves) up",
                      "open", ", ".join(f"{t}: {'never' if np.isinf(c) else 'no refusal' if np.isnan(c) else f'{c:g}'}"
                                        for t, c in moved.items()),
                      moved.notna().all() and moved.is_monotonic_increasing))
    return pd.DataFrame(out)


def write_summary(folder: Path, title: str) -> Path:
    """Collate the notebooks' "paper vs us" tables (``tables/NN_paper_vs_us.md``) into ``folder``/SUMMARY.md."""
    folder = Path(folder)
    tables = sorted((folder / "tables").glob("*_paper_vs_us.md"))
    if not tables:
        raise FileNotFoundError(f"no *_paper_vs_us.md table under {folder / 'tables'}: run the notebooks first")
    parts = [f"# {title}\n", "Written by `fairkv reproduce` from the notebooks' paper-vs-us tables.\n"]
    for table in tables:
        claims = pd.read_csv(table.with_suffix(".csv"))
        parts.append(f"## Notebook {table.name[:2]}: {int(claims['holds'].sum())} of {len(claims)} claims hold\n")
        parts.append(table.read_text())
    summary = folder / "SUMMARY.md"
    summary.write_text("\n".join(parts))
    return summary
