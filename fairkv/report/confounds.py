"""The README's known confounds: what besides the claimed mechanism moves our numbers (benign over-refusal, the token
cap, a self-judging small judge, ROUGE-L on obeyed directives), each with its number read from its committed table
(``fairkv.report.readme`` puts them under the claims)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fairkv.report import analysis, verdicts
from fairkv.runs import studies


class ConfoundError(ValueError):
    """A table the confounds quote is missing, or lacks the cell."""


def table(folder: Path, name: str) -> pd.DataFrame:
    """A committed table (``tables/<name>.csv``) as text, as the notebook printed it."""
    path = Path(folder) / "tables" / f"{name}.csv"
    if not path.exists():
        raise ConfoundError(f"{path} is missing: run the notebook that writes it before the README")
    return pd.read_csv(path, keep_default_na=False, dtype=str)


def cell(folder: Path, name: str, row: dict, column: str) -> str:
    """One cell of a committed table, the row picked by ``row``'s column values."""
    frame = table(folder, name)
    for key, value in row.items():
        frame = frame[frame[key] == value]
    if len(frame) != 1 or column not in frame:
        raise ConfoundError(f"{name}.csv has no single row {row} with a column {column!r}")
    return str(frame[column].iloc[0])


def said(folder: Path, profile: str) -> list[str]:
    """What besides the claimed mechanism moves our numbers, each with its number from its table."""
    grid = studies.PROFILES[profile]
    cap = grid.benign_tokens or grid.max_new_tokens
    refused = cell(folder, "03_fig4_benign_refusals", {"policy": "streamingllm"}, "0.0")
    shares = table(folder, "03_fig4_capped").set_index("policy").loc["streamingllm"]
    peak = max(shares.index, key=lambda r: float(shares[r].split()[0]))  # the ratio with the most capped answers
    judge = table(folder, "10_judge_calibration").iloc[0]
    right = verdicts.Estimate(float(judge["accuracy"]), float(judge["low"]), float(judge["high"]), int(judge["n"]))
    return [
        f"- **Benign over-refusal.** Uncompressed, the model refuses {refused} of the benign IFEval queries "
        "(`03_fig4_benign_refusals`); evicting the defense ends it, so accuracy can rise under compression, and a "
        "mitigation that restores the defense restores these refusals too (the mechanism is judged against them). "
        "Accuracy claims print the share.",
        f"- **The {cap}-token cap.** {shares['0.0']} of StreamingLLM's benign answers stop at the cap at r = 0, "
        f"{shares[peak]} at r = {float(peak):g} (`03_fig4_capped`; the paper allows "
        f"{studies.PROFILES['paper'].benign_tokens}): a capped answer fails "
        f"IFEval's length checks. Accuracy claims say when that share moves by {analysis.CAP_DRIVES:g} or more.",
        f"- **A self-judging small judge.** The judge is the audited model itself, right on "
        f"{right} of {right.n} labelled responses (`10_judge_calibration`); while its interval reaches below "
        f"{analysis.JUDGE_MIN_ACCURACY:g}, every claim resting on it is inconclusive.",
        "- **ROUGE-L counts obeying a short directive as leakage.** An answer carrying the directive's phrase, as "
        "asked, recalls part of it (the paper's metric too).",
    ]
