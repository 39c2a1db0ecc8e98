"""Figures: plot functions take results and return a matplotlib Figure; ``save`` writes PNG and PDF.

Plot functions read and write no files; every figure names the model and the sample size in its title.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from fairkv.evaluate import Evaluation
from fairkv.paths import figures_dir
from fairkv.presses import get_policy


def save(fig: plt.Figure, name: str, folder: Path | None = None) -> list[Path]:
    """Write ``name``.png and ``name``.pdf under ``folder`` (default: the figures directory); return the paths."""
    folder = Path(folder) if folder is not None else figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.{ext}" for ext in ("png", "pdf")]
    for path in paths:
        fig.savefig(path, bbox_inches="tight", dpi=150, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    return paths


def keep_map_figure(evaluation: Evaluation) -> plt.Figure:
    """Kept-token map: per policy, the fraction of (layer, KV head) pairs keeping each prefix token, per ratio.

    Span boundaries are drawn as vertical lines and each span is labelled; the whitelist phrase is marked below.
    """
    prompt = evaluation.prompt
    policies = list(dict.fromkeys(p for p, _ in evaluation.keep_maps))
    ratios = sorted({r for _, r in evaluation.keep_maps})
    fig, axes = plt.subplots(len(policies), 1, figsize=(11, 1.0 + 0.45 * len(ratios) * len(policies)), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, policy in zip(axes, policies):
        grid = np.stack([evaluation.keep_maps[(policy, r)].numpy() for r in ratios])
        image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_yticks(range(len(ratios)), [f"r={r:g}" for r in ratios], fontsize=7)
        ax.set_ylabel(get_policy(policy).label, rotation=0, ha="right", va="center", fontsize=9)
        for span in prompt.spans[1:]:
            ax.axvline(span.start - 0.5, color="white", lw=1.5)
        if prompt.protected:
            ax.plot(prompt.protected, [len(ratios) - 0.5] * len(prompt.protected), "|", color="red", ms=6)
    for span in prompt.spans:
        axes[0].text((span.start + span.end) / 2, -0.8, span.name, ha="center", va="bottom", fontsize=9)
    axes[-1].set_xlabel("prefix token position (red ticks: whitelist phrase)")
    fig.colorbar(image, ax=list(axes), label="share kept", fraction=0.02, pad=0.01)
    fig.suptitle(
        f"Kept-token map (share of layers x KV heads keeping each token) - model {evaluation.model}, "
        f"record {int(evaluation.rows['key'].iloc[0])}, n = {prompt.n_tokens} tokens",
        fontsize=10,
    )
    return fig


def policy_curves(evaluation: Evaluation, columns: dict[str, str]) -> plt.Figure:
    """One panel per metric column (column -> axis label), one line per policy, against the compression ratio."""
    rows = evaluation.rows.assign(policy=evaluation.rows["policy"].map(lambda p: get_policy(p).label))
    fig, axes = plt.subplots(1, len(columns), figsize=(4 * len(columns), 3.2), sharex=True)
    for ax, (column, label) in zip(np.atleast_1d(axes), columns.items()):
        sns.lineplot(data=rows, x="ratio", y=column, hue="policy", marker="o", ax=ax, legend=ax is np.atleast_1d(axes)[-1])
        ax.set_ylabel(label)
        ax.set_xlabel("compression ratio r")
        ax.set_ylim(-0.05, 1.05)
    fig.suptitle(f"model {evaluation.model}, record {int(evaluation.rows['key'].iloc[0])}, n = 1 prompt", fontsize=10)
    fig.tight_layout()
    return fig
