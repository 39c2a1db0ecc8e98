"""Beyond the paper: eviction bias across every kvpress press (notebook 12, the press atlas).

The paper measures five policies (Section 4). kvpress exports many more presses; the registry of policies
(``presses.registry``: ``REGISTRY`` and ``NOT_RUN``) names every one of them with how it runs, or why it cannot run
here (``skipped``).

Keep rates come from one prefill per prompt (``keep_rates``): kvpress compresses a layer's cache in a hook after that
layer's attention, so the hook's inputs never depend on the press, and the collector calls every press's own
``compress`` at every ratio on them (``presses.kept``: which positions a press kept is read from what it returns).
No press is re-implemented: kvpress decides every kept set.

What the rows say (each press's bias and pattern, the attack side's claims) is ``fairkv.report.press_patterns``'s.
The attack side of the most biased presses is a study like every grid (``fairkv.studies.atlas.ATTACKS``, the
catalogue's keys as its policies), run into the atlas's folder (``folder_for``); the plan at each profile is the atlas
study's (``fairkv.studies.atlas.STUDY``).

Keep-rate rows live in their own store (``store_path``), computed by ``runner.run``, and carry ``versions`` with the
atlas's own fingerprint (``fingerprint.ATLAS``, beside the sweep's): an edit of the code they run never mixes with
older atlas rows.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pandas as pd
import torch
from kvpress import BasePress
from kvpress.utils import compute_n_kept

from fairkv.core import data, models, prompts
from fairkv.core.per_setting import head_dim_known
from fairkv.core.presses.kept import PRESS_FAILURES, SEED, press_mask
from fairkv.core.presses.rates import span_rates
from fairkv.core.presses.policy import Policy
from fairkv.core.presses.registry import NOT_RUN, provenance, runnable
from fairkv.core.presses.selection import topk_select
from fairkv.core.progress import note
from fairkv.runs import experiment, fingerprint, runner, studies
from fairkv.runs.store import ResultsStore
from fairkv.runs.studies import results_folder

SPANS = ("defense", "directive")


class AtlasError(ValueError):
    """An atlas plan that cannot be run as asked, or rows it cannot read."""


def skipped() -> pd.DataFrame:
    """The presses the atlas does not run, with the reason (listed in the notebook, never skipped silently)."""
    return pd.DataFrame(list(NOT_RUN.items()), columns=["press", "why not"])


class _Collector(BasePress):
    """Calls every press's ``compress`` at every ratio on each layer's uncompressed prefill (a ratio-free scorer's
    ``score`` once, cut at every ratio by ``ScorerPress``'s top-k); compresses nothing. A press that raises on this
    prompt (``PRESS_FAILURES``) is recorded with its error, and the other presses go on."""

    def __init__(self, entries: list[Policy], ratios: tuple[float, ...]):
        self.entries, self.ratios = entries, ratios
        self.presses = {(e.label, r): e.build(r) for e in entries for r in ratios}
        self.masks: dict[tuple[str, float], list[torch.Tensor]] = {key: [] for key in self.presses}
        self.errors: dict[tuple[str, float], str] = {}

    def post_init_from_model(self, model):
        for press in self.presses.values():
            press.post_init_from_model(model)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        batch, heads, n, _ = keys.shape
        for entry in self.entries:
            weights = attentions if entry.attentions else None
            if entry.ratio_free:
                if (entry.label, self.ratios[0]) in self.errors:
                    continue
                try:
                    torch.manual_seed(SEED + module.layer_idx)
                    press = self.presses[(entry.label, self.ratios[0])]
                    scores = press.score(module, hidden_states, keys, values, weights, kwargs)
                except PRESS_FAILURES as error:
                    self.errors.update({(entry.label, ratio): _described(error) for ratio in self.ratios})
                    continue
                for ratio in self.ratios:
                    kept = topk_select(scores, compute_n_kept(n, ratio)).cpu()
                    self.masks[(entry.label, ratio)].append(
                        torch.zeros(batch, heads, n, dtype=torch.bool).scatter_(-1, kept, True)
                    )
                continue
            for ratio in self.ratios:
                key = (entry.label, ratio)
                if key in self.errors:
                    continue
                try:
                    self.masks[key].append(
                        press_mask(self.presses[key], module, hidden_states, keys, values, weights, kwargs)
                    )
                except PRESS_FAILURES as error:
                    self.errors[key] = _described(error)
        return keys, values


def _described(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


@torch.inference_mode()
def keep_rates(lm: models.LoadedModel, prompt: prompts.Prompt, entries: list[Policy], ratios) -> dict:
    """{(label, ratio): ({span: keep rate}, error)} for every entry and ratio, from one prefill of ``prompt``; a press
    that raised on this prompt has NaN keep rates and the error it raised (None for the others)."""
    collector = _Collector(entries, tuple(ratios))
    with head_dim_known(lm.model), collector(lm.model):
        lm.model.model(input_ids=prompt.ids.to(lm.device))
    failed = {span.name: float("nan") for span in prompt.spans}
    return {
        key: (failed, collector.errors[key]) if key in collector.errors else (span_rates(masks, prompt.spans), None)
        for key, masks in collector.masks.items()
    }


@dataclass(frozen=True)
class Plan:
    """What the atlas computes: every runnable press (or ``presses``) x ``ratios`` x ``orders`` on ``n_prompts``
    prompts of the profile's dataset, with the profile's model and precision."""

    profile: str = "ci"
    n_prompts: int = 4
    ratios: tuple[float, ...] = (0.3, 0.5, 0.7)
    orders: tuple[str, ...] = ("normal", "flipped")
    presses: tuple[str, ...] | None = None

    @property
    def grid(self) -> experiment.Grid:
        return studies.profile(self.profile)

    def entries(self) -> list[Policy]:
        return runnable(self.presses)


def _cells(label: str, n: int) -> str:
    return f"{label} ({n} cell{'s' if n != 1 else ''})"


def describe(chosen: Plan, rows: pd.DataFrame) -> str:
    """What was run, from the rows (printed under the notebook's parameters)."""
    grid = chosen.grid
    return (
        f"press atlas at profile {chosen.profile!r} on {grid.model} ({grid.dtype}): {rows['key'].nunique()} prompts "
        f"of {grid.dataset}, orders {list(chosen.orders)}, {rows['press'].nunique()} presses, ratios "
        f"{list(chosen.ratios)}; {len(rows)} rows, {rows.drop_duplicates(['key', 'order'])['prompt_s'].sum():.0f} s "
        f"of prefill and scoring (one prefill per prompt and order); {len(skipped())} kvpress presses not run "
        f"(listed below with the reason)"
    )


def versions() -> dict[str, str]:
    """The result code's versions with the atlas's own fingerprint beside them."""
    return {**fingerprint.versions(), "atlas": fingerprint.of(fingerprint.ATLAS)}


def folder_for(profile: str) -> Path:
    """The atlas's results folder: ``<results>/<profile>/atlas/`` (keep rates, and the attack rows of the presses
    beyond the paper's five, apart from the paper's rows)."""
    return results_folder(profile) / "atlas"


def store_path(plan: Plan, folder: Path | None = None) -> Path:
    safe = plan.grid.model.replace("/", "__")
    return (Path(folder) if folder else folder_for(plan.profile)) / f"{safe}.keep-rates.jsonl"


def _identity(plan: Plan, record, order: str, label: str, ratio: float) -> dict:
    grid = plan.grid
    return {
        "kind": "atlas",
        "model": grid.model,
        "dtype": grid.dtype,
        "dataset": grid.dataset,
        "key": record.key,
        "order": order,
        "press": label,
        **provenance(label),  # a press of one's own: its source (kvpress's: nothing, ids unchanged)
        "ratio": ratio,
    }


@dataclass(frozen=True)
class Job:
    """The keep rates of ``plan`` for ``runner.run``: a task is one (prompt, order), one prefill for every press and
    ratio of it."""

    plan: Plan
    records: tuple
    templates: dict
    versions: dict

    def cells(self) -> dict[tuple, str]:
        plan = self.plan
        return {
            (record, order, e.label, r): experiment.cell_id(_identity(plan, record, order, e.label, r))
            for record in self.records
            for order in plan.orders
            for e in plan.entries()
            for r in plan.ratios
        }

    def tasks(self, missing: list[tuple]) -> list[tuple]:
        return list(dict.fromkeys((record, order) for record, order, _, _ in missing))

    def remedy(self, missing: list[tuple]) -> str:
        """What a frozen run says of ``missing`` cells: the presses they are of, and the one command computing them
        alone (a press added to the catalogue lacks its rows)."""
        counts = Counter(label for _, _, label, _ in missing)
        return (
            f"Missing: the keep rates of {', '.join(_cells(label, n) for label, n in counts.items())}. "
            f"Compute only them: fairkv reproduce 12 -p profile {self.plan.profile} (every stored row is reused), "
            "then seal the store (fairkv store seal) to commit them."
        )

    def load(self, device: str | None = None) -> models.LoadedModel:
        grid = self.plan.grid
        return models.load_model(grid.model, dtype=getattr(torch, grid.dtype), device=device)

    def model_key(self) -> tuple:
        grid = self.plan.grid
        return (grid.model, False, grid.dtype)

    def compute(self, lm: models.LoadedModel, tasks: list[tuple]) -> Iterator[list[dict]]:
        for task in tasks:
            yield self._rows(lm, *task)

    def _rows(self, lm: models.LoadedModel, record, order: str) -> list[dict]:
        plan = self.plan
        entries = plan.entries()
        note(f"prefilling prompt {record.key} ({order}) for {len(entries)} presses x {len(plan.ratios)} ratios")
        prompt = prompts.paper_prompt(lm.tokenizer, record, self.templates, order)
        start = time.perf_counter()
        rates = keep_rates(lm, prompt, entries, plan.ratios)
        seconds = time.perf_counter() - start
        return [
            {
                "cell_id": experiment.cell_id(_identity(plan, record, order, label, ratio)),
                **_identity(plan, record, order, label, ratio),
                "keep": keep,
                "error": error,
                "n_tokens": prompt.n_tokens,
                "prompt_s": seconds,
                "versions": fingerprint.stamped(self.versions, label),
            }
            for (label, ratio), (keep, error) in rates.items()
        ]


def run(
    plan: Plan, folder: Path | None = None, progress: bool = True, lm: models.LoadedModel | None = None
) -> pd.DataFrame:
    """Keep rates of ``plan`` (one row per prompt, order, press and ratio): computes what its store lacks with
    ``runner.run``, one prefill per (prompt, order), appending each prompt's rows as they land; rows of other code
    or versions are an error."""
    grid = plan.grid
    records = tuple(data.load_records(grid.dataset)[: plan.n_prompts])
    job = Job(plan, records, data.load_defense_templates(), versions())
    done = runner.run(job, ResultsStore(store_path(plan, folder)), lm=lm, progress=progress, desc="atlas rows")
    ids = job.cells()
    frame = pd.DataFrame([done[cid] for cid in ids.values()])
    for span in SPANS:
        frame[f"keep_{span}"] = frame["keep"].map(lambda keep, span=span: keep[span])
    entries = plan.entries()
    scoring = {e.label: e.scoring for e in entries}
    return frame.assign(
        scoring=frame["press"].map(scoring), paper=frame["press"].isin([e.label for e in entries if e.paper])
    )


__all__ = [
    "AtlasError",
    "Job",
    "Plan",
    "describe",
    "keep_rates",
    "run",
    "skipped",
]
