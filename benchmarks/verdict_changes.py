"""Which claims changed verdict between a committed revision's paper-vs-us tables and the working tree's.

    .venv/bin/python benchmarks/verdict_changes.py --before 4d24046 --profile cpu --notebooks 01 02

For each notebook, every claim of its ``NN_paper_vs_us`` table (``figures/<profile>/tables/``) at ``--before`` beside
the same claim now: n, our estimate with its 95% interval (the first clause of ``ours``, before the notes on refusals
and capped answers), the direction verdict and the magnitude. Claims are matched by figure and claim text (a claim's
parts, in tables of one line per claim, are left out); a claim only one side has is listed with the other side empty. A ``*`` marks a changed direction verdict, ``~`` a changed
magnitude only. Reads committed tables only: it recomputes nothing.
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
KEY = ["figure", "claim"]
SHOWN = ["n", "estimate", "verdict", "magnitude"]


def table(text: str, where: str) -> pd.DataFrame:
    """A paper-vs-us table (read from ``where``) with its estimate: the ``ours`` column up to its notes."""
    frame = pd.read_csv(io.StringIO(text), dtype={"n": str}).fillna("")
    missing = sorted(set(KEY + ["ours", "n", "verdict", "magnitude"]) - set(frame.columns))
    if missing:
        raise SystemExit(f"{where} has no column {', '.join(missing)}: a table older than these columns")
    if "part" in frame:  # one line per claim (issue 50): its parts below it are not claims
        frame = frame[frame["part"] == ""]
    frame["estimate"] = frame["ours"].str.split(";").str[0]
    return frame[KEY + SHOWN]


def before(revision: str, path: Path) -> pd.DataFrame:
    shown = subprocess.run(
        ["git", "show", f"{revision}:{path.relative_to(REPO)}"], check=False, cwd=REPO, capture_output=True, text=True
    )
    if shown.returncode != 0:
        raise SystemExit(f"{path.name} is not in revision {revision}: {shown.stderr.strip()}")
    return table(shown.stdout, f"{path.name} at {revision}")


def changes(old: pd.DataFrame, new: pd.DataFrame) -> list[str]:
    joined = old.merge(new, on=KEY, how="outer", suffixes=(" before", " now")).fillna("")
    lines = []
    for row in joined.to_dict("records"):
        changed = [row[f"{column} before"] != row[f"{column} now"] for column in ("verdict", "magnitude")]
        mark = "*" if changed[0] else "~" if changed[1] else " "
        claim = row["claim"] if row["claim"].startswith(row["figure"]) else f"{row['figure']}: {row['claim']}"
        lines.append(f"{mark} {claim}")
        for side in ("before", "now"):
            lines.append(
                f"    {side:6} n = {row[f'n {side}'] or '-':>4}  {row[f'verdict {side}'] or '-':12} "
                f"{row[f'magnitude {side}'] or '-':8} {row[f'estimate {side}']}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the git revision whose tables are the 'before'")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--notebooks", nargs="+", required=True, help="notebook numbers, e.g. 01 02")
    args = parser.parse_args()
    folder = REPO / "figures" / args.profile / "tables"
    print(f"claims of notebooks {' '.join(args.notebooks)} ({args.profile} profile): {args.before} against now")
    for notebook in args.notebooks:
        path = folder / f"{notebook}_paper_vs_us.csv"
        if not path.exists():
            raise SystemExit(f"{path} does not exist: render notebook {notebook} at the {args.profile} profile first")
        print(f"\nnotebook {notebook}")
        print("\n".join(changes(before(args.before, path), table(path.read_text(), str(path)))))


if __name__ == "__main__":
    main()
