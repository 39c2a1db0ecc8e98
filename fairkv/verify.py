"""Recompute stored rows from scratch and say how many come out identical (``fairkv verify --sample K``).

A committed results store (``results/cpu/``) is only as good as the claim that this code computes it. ``verify`` draws
K rows at random (seeded), rebuilds each row's one-cell grid from its identity (model, precision, dataset and prompt,
order, setting, query, token budget, template), computes it in an empty store with the stored model and precision,
and compares every field except timings and library stamps (``IGNORED``): the response, the keep rates and every
score. The rebuilt cell must have the stored cell id, so a row whose identity this code cannot rebuild is an error,
not a mismatch.

Rows computed by other result code (another ``versions["code"]``, ``fairkv.fingerprint``) are refused: this code
cannot vouch for them. A cell recomputed alone decodes in a batch of one: in bfloat16 a batch's shape changes how
matmuls round, so a response can differ after a near-tie between two tokens (the engine test measures 52 of 60
identical, plain loop vs running batch); float32 rows recompute exactly. The report names the fields that differ.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fairkv import data, experiment, metrics
from fairkv.progress import Bar
from fairkv.store import ResultsStore

IGNORED = {"prefill_s", "cut_s", "decode_s", "versions", "schema"}  # timings and stamps: never equal twice


class VerifyError(ValueError):
    """Rows that cannot be recomputed by this code."""


@dataclass
class Report:
    store: str
    sampled: int
    identical: int = 0
    differing: dict[str, list[str]] = field(default_factory=dict)  # cell id -> fields that differ

    def __str__(self) -> str:
        lines = [f"{self.store}: {self.identical} of {self.sampled} rows recomputed identically"]
        lines += [f"  {cell}: differs in {', '.join(fields)}" for cell, fields in self.differing.items()]
        return "\n".join(lines)


def cell_grid(row: dict) -> experiment.Grid:
    """The one-cell grid whose only cell is ``row``'s (its cell id is checked by ``verify``)."""
    keys = [record.key for record in data.load_records(row["dataset"])]
    if row["key"] not in keys:
        raise VerifyError(f"cell {row['cell_id']}: prompt {row['key']} is not in {row['dataset']}")
    tokens = max(1, int(row["max_new_tokens"]))  # keep rows decode nothing (0): any budget gives their identity
    return experiment.Grid(
        model=row["model"], dataset=row["dataset"], start=keys.index(row["key"]), n_prompts=1, orders=(row["order"],),
        policies=(row["policy"] if row["policy"] != "none" else "streamingllm",), variants=(row["variant"],),
        lams=(row["lam"],), ratios=(row["ratio"],), queries=(row["query"],), max_new_tokens=tokens,
        benign_tokens=tokens, int8=row["int8"], dtype=row["dtype"], template=row.get("template"), batch_size=1,
    )


def differences(stored: dict, fresh: dict) -> list[str]:
    """The fields (other than ``IGNORED``) whose values differ, or that only one row has."""
    names = (set(stored) | set(fresh)) - IGNORED
    return sorted(name for name in names if stored.get(name, "<missing>") != fresh.get(name, "<missing>"))


def verify(path: Path, sample: int, seed: int = 0, progress: bool = True) -> Report:
    """Recompute ``sample`` random rows of the store at ``path`` (all if fewer) and compare them field by field."""
    rows = list(ResultsStore(path).rows().values())
    if not rows:
        raise VerifyError(f"{path} holds no rows")
    code = metrics.versions()["code"]
    foreign = sum(row.get("versions", {}).get("code") != code for row in rows)
    if foreign:
        raise VerifyError(f"{path}: {foreign} of {len(rows)} rows were computed by other result code than this "
                          f"checkout's ({code}, fairkv.fingerprint); check out the code that computed them")
    chosen = random.Random(seed).sample(rows, min(sample, len(rows)))
    report = Report(str(path), len(chosen))
    models = {}
    bar = Bar(total=len(chosen), desc="verified", unit="row", disable=not progress)
    with tempfile.TemporaryDirectory(prefix="fairkv-verify-") as scratch:
        for row in chosen:
            grid = cell_grid(row)
            job = experiment.Job(grid, data.load_defense_templates(), grid.attacks(), metrics.versions())
            lm = models.get((grid.model, grid.dtype, grid.int8)) or job.load()
            models[(grid.model, grid.dtype, grid.int8)] = lm
            folder = Path(scratch) / row["cell_id"]
            experiment.run(grid, folder, progress=False, lm=lm)
            fresh = experiment.store_for(grid, folder).rows()
            if row["cell_id"] not in fresh:
                raise VerifyError(f"cell {row['cell_id']}: its rebuilt grid computes cell(s) {sorted(fresh)}; this "
                                  "code cannot rebuild the row's identity")
            changed = differences(row, fresh[row["cell_id"]])
            if changed:
                report.differing[row["cell_id"]] = changed
            else:
                report.identical += 1
            bar.update(1)
    bar.close()
    return report
