"""Declarative sweeps: a grid of settings run prompt by prompt into the results store, resumable at any point.

A ``Grid`` names the model, a slice of sys_ifeval, orders, policies, variants, lambdas, ratios and query kinds. Each
(prompt, order, setting, query) is one row of the store, keyed by a hash of what determines it (model checksum,
int8, prompt, setting, query, max_new_tokens, metrics version), so a cell requested by two notebooks or twice by one
is computed once. Settings are canonical: r = 0 is one cell ("none") shared by every policy and variant, fair with
lam = 0 is the base selection, and lam only matters for fair variants.

Per prompt and order: one prefill scores every policy (``score_once.prefill``); each missing setting is cut from it
(``score_once.cut``). Prompts go in groups that fill a few decode batches; the group's missing (cache, query) pairs decode
in one running batch (``generation.answer_batch``) and its rows are appended together, so a killed run loses at most
the group in progress and recomputes nothing finished.

Profiles (``PROFILES``) are named grids: ``ci`` (SmolLM2, a few prompts, minutes), ``cpu`` (the embedded
Qwen2.5-Coder-1.5B on a 2-core CPU in bfloat16), ``paper`` (the paper's scale, a Hugging Face model on a GPU).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from fairkv.core import data, generation, metrics, models, prompts, score_once
from fairkv.core.paths import results_dir
from fairkv.core.presses import POLICIES, check_ratio, check_variant, get_policy
from fairkv.core.presses.selection import check_lam
from fairkv.core.progress import Bar
from fairkv.core.progress import note as progress_note
from fairkv.runs import executors, fingerprint
from fairkv.runs.store import ResultsStore, StoreError

# keep: no decoding, the row holds the keep rates and timings only; "attack" is the paper's attack, and any
# RaccoonBench attack is a query kind of its own, "attack:<suite>/<category>/<name>" (data.attack_query)
QUERIES = ("benign", "attack", "keep")
DTYPES = ("float32", "bfloat16", "float16")  # the model's precision; part of every cell's identity
TASK_BATCHES = 3  # a task holds about this many decode batches: the batch drains only at a task's end


class GridError(ValueError):
    """A grid or profile that cannot be run as asked."""


@dataclass(frozen=True)
class Setting:
    """One compression setting; ``policy`` None means uncompressed (r = 0)."""

    policy: str | None
    variant: str
    lam: float
    ratio: float


def canonical(policy: str, variant: str, lam: float, ratio: float) -> Setting:
    """The setting that computes (policy, variant, lam, ratio): r = 0 is shared, fair at lam = 0 is the base."""
    if ratio == 0.0:
        return Setting(None, "base", 1.0, 0.0)
    if variant.startswith("fair") and lam == 0.0:
        variant = "whitelist" if "whitelist" in variant else "base"
    return Setting(policy, variant, lam if variant.startswith("fair") else 1.0, ratio)


@dataclass(frozen=True)
class Grid:
    """What to run. ``max_new_tokens`` applies to both queries (the paper: 1280 benign, 256 attack)."""

    model: str = models.DEFAULT_MODEL
    dataset: str = "sys_ifeval_shuffled"
    start: int = 0
    n_prompts: int | None = 4
    orders: tuple[str, ...] = ("normal",)
    policies: tuple[str, ...] = tuple(POLICIES)
    variants: tuple[str, ...] = ("base",)
    lams: tuple[float, ...] = (1.0,)
    ratios: tuple[float, ...] = (0.0, 0.5)
    queries: tuple[str, ...] = ("benign", "attack")
    template: str | None = None  # a defense template by name (defense_template.json); None: the order's template
    max_new_tokens: int = 32
    benign_tokens: int | None = None  # override for the benign query (IFEval needs longer answers)
    int8: bool = False
    dtype: str = "float32"  # "bfloat16": the paper's GPU precision
    batch_size: int = 32
    note: str = field(default="", compare=False)  # which corners the profile cuts

    def __post_init__(self):
        for policy in self.policies:
            get_policy(policy)
        for variant in self.variants:
            check_variant(variant)
        for ratio in self.ratios:
            check_ratio(ratio)
        for lam in self.lams:
            check_lam(lam)
        for order in self.orders:
            if order not in prompts.ORDERS:
                raise GridError(f"unknown order {order!r}: use one of {', '.join(prompts.ORDERS)}")
        if self.dtype not in DTYPES:
            raise GridError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        for query in self.queries:
            if query not in QUERIES and not query.startswith(data.ATTACK_QUERY):
                raise GridError(
                    f"unknown query kind {query!r}: use one of {', '.join(QUERIES)} or "
                    f"'{data.ATTACK_QUERY}<suite>/<category>/<name>'"
                )

    def tokens_for(self, query: str) -> int:
        if query == "keep":
            return 0
        return self.benign_tokens if query == "benign" and self.benign_tokens else self.max_new_tokens

    def attacks(self) -> dict[str, str]:
        """The text of every attack query kind of the grid (an unknown attack is an error naming it)."""
        wanted = [q for q in self.queries if q not in ("benign", "keep")]
        if not wanted:
            return {}
        known = {data.attack_query(a): a.text for a in data.load_attacks()}
        known["attack"] = data.paper_attack().text
        unknown = [q for q in wanted if q not in known]
        if unknown:
            raise GridError(f"unknown attack(s) {unknown}; RaccoonBench's are listed by data.attack_queries()")
        return {q: known[q] for q in wanted}

    def requested(self) -> list[tuple[str, str, float, float]]:
        """Every (policy, variant, lam, ratio) the grid asks for, as labels for the returned rows."""
        lams = lambda variant: self.lams if variant.startswith("fair") else (1.0,)
        return [(p, v, lam, r) for p in self.policies for v in self.variants for lam in lams(v) for r in self.ratios]

    def settings(self) -> list[Setting]:
        """The distinct settings to compute, in a fixed order."""
        return list(dict.fromkeys(canonical(*request) for request in self.requested()))

    def with_overrides(self, **overrides) -> "Grid":
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise GridError(f"unknown grid parameter(s) {sorted(unknown)}")
        tuples = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
        return dataclasses.replace(self, **tuples)


PROFILES: dict[str, Grid] = {
    "ci": Grid(
        n_prompts=4,
        ratios=(0.0, 0.3, 0.5, 0.7),
        max_new_tokens=32,
        note="SmolLM2-135M, 4 prompts, 4 ratios, 32 new tokens: checks the pipeline in minutes, not the science",
    ),
    "cpu": Grid(
        model="qwen2.5-coder-1.5b",
        n_prompts=100,
        orders=("normal", "flipped"),
        ratios=(0.0, 0.3, 0.5, 0.7, 0.9),
        max_new_tokens=128,
        benign_tokens=256,
        variants=("base", "whitelist", "fair"),
        dtype="bfloat16",
        batch_size=128,
        note="Qwen2.5-Coder-1.5B in bfloat16 on 2 CPU cores (the fidelity gate of benchmarks/precision_gate.py: the same "
        "refusals as float32): the attack side on 100 prompts in both orders (the paper's leakage set); the benign "
        "(IFEval) side on the first 50 of them, normal order (flipped only where a claim reads it), 256 new tokens "
        "(paper: 1280, so instructions that need longer answers can fail at every ratio); 128 new tokens for the "
        "attack (paper: 256); ratios 0, 0.3, 0.5, 0.7, 0.9 (paper: 0-0.9 by 0.1), the mitigations at 0-0.7 with the "
        "ratios their claims read (0.4, 0.6)",
    ),
    "paper": Grid(
        model="meta-llama/Llama-3.1-8B-Instruct",
        n_prompts=None,
        orders=("normal", "flipped"),
        variants=("base", "whitelist", "fair"),
        ratios=tuple(round(0.1 * i, 1) for i in range(10)),
        max_new_tokens=256,
        benign_tokens=1280,
        dtype="bfloat16",
        batch_size=16,
        note="the paper's scale: all 539 prompts, both orders, 10 ratios, 1280 / 256 new tokens, bfloat16; needs a GPU",
    ),
}


def profile(name: str, **overrides) -> Grid:
    """A named profile, with explicit overrides (the layer notebooks and the CLI use)."""
    if name not in PROFILES:
        raise GridError(f"unknown profile {name!r}: use one of {', '.join(PROFILES)}")
    return PROFILES[name].with_overrides(**overrides)


def cell_id(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def _identity(lm_name: str, checksum: str | None, grid: Grid, record, order, setting: Setting, query: str) -> dict:
    return {
        "model": lm_name,
        "checksum": checksum,
        "int8": grid.int8,
        "dtype": grid.dtype,
        "dataset": grid.dataset,
        "key": record.key,
        "order": order,
        "policy": setting.policy or "none",
        "variant": setting.variant,
        "lam": setting.lam,
        "ratio": setting.ratio,
        "query": query,
        "max_new_tokens": grid.tokens_for(query),
        "metrics": metrics.METRICS_VERSION,
        **({"template": grid.template} if grid.template else {}),  # absent for the order's template: ids unchanged
    }


def _checksum(name: str) -> str | None:
    return models.EMBEDDED[name].sha256 if name in models.EMBEDDED else None


def store_for(grid: Grid, folder: Path | None = None) -> ResultsStore:
    safe = grid.model.replace("/", "__")
    return ResultsStore((Path(folder) if folder else results_dir()) / f"{safe}.jsonl")


@dataclass(frozen=True)
class Job:
    """What every task of a run shares: the grid, the defense templates, the attacks and the library versions the
    rows are stamped with. Executors call ``compute`` on their own loaded model (``load``), in this process or a
    Ray worker's."""

    grid: Grid
    templates: dict
    attacks: dict[str, str]  # query kind -> attack text
    versions: dict

    def load(self, device: str | None = None) -> models.LoadedModel:
        return models.load_model(
            self.grid.model, int8=self.grid.int8, dtype=getattr(torch, self.grid.dtype), device=device
        )

    def compute(self, lm: models.LoadedModel, task: list) -> list[dict]:
        return _compute(lm, self.grid, task, self.templates, self.attacks, self.versions)


def run(
    grid: Grid,
    folder: Path | None = None,
    progress: bool = True,
    lm: models.LoadedModel | None = None,
    executor="serial",
    wait: bool = True,
) -> pd.DataFrame:
    """Compute what the store lacks for ``grid`` and return the grid's rows (one per prompt, order, setting label
    and query; r = 0 rows repeated under every policy and variant).

    ``executor``: "serial" (this process; ``lm`` reuses a loaded model), "ray" (a Ray cluster: ``RAY_ADDRESS`` or a
    local one), or a spec (``{"kind": "ray", "address": ..., "workers": ...}``, see ``fairkv.runs.executors``). Every
    executor computes the same tasks (a group of prompts with all their missing settings and queries); only this
    process writes the store, task by task as results arrive.

    When cells are missing, the run holds the store's compute lock (``ResultsStore.computing``): if another process
    computes the same store, it waits for it and reuses its rows (``wait=False``: raises ``StoreBusy`` naming it)."""
    if lm is not None and lm.model.dtype != getattr(torch, grid.dtype):
        raise GridError(
            f"the model passed in runs in {lm.model.dtype}, the grid asks for {grid.dtype}: rows of "
            "another precision are never mixed; load it with that dtype or set the grid's dtype"
        )
    store = store_for(grid, folder)
    records = data.load_records(grid.dataset)
    records = records[grid.start : grid.start + grid.n_prompts if grid.n_prompts is not None else None]
    if not records:
        raise GridError(f"the slice start={grid.start}, n_prompts={grid.n_prompts} of {grid.dataset} is empty")
    job = Job(grid, data.load_defense_templates(), grid.attacks(), fingerprint.versions())
    checksum = lm.checksum if lm is not None else _checksum(grid.model)
    done = store.rows()
    tasks, total = _plan(grid, records, checksum, done, job.versions, store)
    if tasks:
        with store.computing(wait):
            done = store.rows()  # rows another process stored while this one waited are reused
            tasks, total = _plan(grid, records, checksum, done, job.versions, store)
            missing = sum(len(cells) for task in tasks for _, _, cells, _ in task)
            bar = Bar(total=total, initial=total - missing, desc="rows", unit="row", disable=not progress)
            for rows in executors.executor(executor, lm).map(job, tasks) if tasks else ():
                rows = [row for row in rows if row["cell_id"] not in done]  # a task retried after its rows landed
                done.update({row["cell_id"]: row for row in store.append(rows)})
                bar.update(len(rows))
            bar.close()
    return _collect(grid, records, done, checksum)


def _plan(grid: Grid, records, checksum, done: dict, versions: dict, store: ResultsStore) -> tuple[list[list], int]:
    """The tasks that compute what ``done`` lacks, and the grid's row count. A task is a group of (record, order,
    missing (setting, query) pairs, cell ids): enough prompts for ``TASK_BATCHES`` decode batches of their settings'
    queries (the running batch stays full until the task's last answers); a prompt's settings and queries never
    straddle two tasks (they share one prefill)."""
    settings = grid.settings()
    units = [(record, order) for record in records for order in grid.orders]
    decoded = max(1, sum(query != "keep" for query in grid.queries))
    group = max(1, TASK_BATCHES * grid.batch_size // (len(settings) * decoded))
    tasks = []
    for first in range(0, len(units), group):
        task = []
        for record, order in units[first : first + group]:
            ids = {
                (s, q): cell_id(_identity(grid.model, checksum, grid, record, order, s, q))
                for s in settings
                for q in grid.queries
            }
            for cid in set(ids.values()) & done.keys():
                _check_versions(done[cid], versions, store)
            missing = [(s, q) for (s, q), cid in ids.items() if cid not in done]
            if missing:
                task.append((record, order, missing, ids))
        if task:
            tasks.append(task)
    return tasks, len(units) * len(settings) * len(grid.queries)


def _check_versions(row: dict, current: dict, store: ResultsStore) -> None:
    """A stored row computed under other library versions is reported, never mixed into this run's results."""
    if row.get("versions") != current:
        stored = row.get("versions") or {}
        changed = ", ".join(
            f"{name} {stored.get(name)} (now {current.get(name)})"
            for name in sorted(set(stored) | set(current))
            if stored.get(name) != current.get(name)
        )
        raise StoreError(
            f"{store.path} holds cell {row['cell_id']} of this grid computed with {changed}; results of different "
            "versions or code (the fingerprint 'code', fairkv.runs.fingerprint) are not mixed: use another results folder "
            "(FAIRKV_RESULTS_DIR), or move this file away to recompute its rows with this code"
        )


def _compute(lm, grid: Grid, work, templates, attacks: dict[str, str], versions: dict) -> list[dict]:
    """Rows for the missing (setting, query) pairs of a group of prompts: one prefill per prompt, every setting cut
    from it, then every query of the group decoded in one running batch of ``grid.batch_size`` sequences, each with
    its own token budget."""
    items = []  # (record, prompt, prefilled, setting, compressed, query, cell id), in a fixed order
    for number, (record, order, missing, ids) in enumerate(work, start=1):
        progress_note(f"prefilling prompt {number} of {len(work)} in this task")
        prompt = prompts.prompt_for(lm.tokenizer, record, templates, order, grid.template)
        policies = tuple(dict.fromkeys(s.policy for s, _ in missing if s.policy is not None))
        prefilled = score_once.prefill(lm, prompt, policies)
        cuts = {
            s: score_once.cut(prefilled, s.policy, s.ratio, s.variant, s.lam)
            for s in dict.fromkeys(s for s, _ in missing)
        }
        items += [(record, order, prompt, prefilled, s, cuts[s], q, ids[(s, q)]) for s, q in missing]
    rows = [_row(grid, lm, item, versions) for item in items if item[6] == "keep"]
    text = {**attacks, "benign": None}
    todo = [item for item in items if item[6] != "keep"]
    if todo:
        pairs = [(c, p.query_ids(text[q] or r.user)) for r, _, p, _, _, c, q, _ in todo]
        answers = generation.answer_batch(
            lm, pairs, [grid.tokens_for(item[6]) for item in todo], batch_size=grid.batch_size
        )
        rows += [_row(grid, lm, item, versions, reply) for item, reply in zip(todo, answers)]
    return rows


def _row(grid: Grid, lm, item, versions: dict, reply: generation.Answer | None = None) -> dict:
    """One store row: identity, keep rates, timings and (for a decoded query) the response and its scores."""
    record, order, prompt, prefilled, setting, compressed, query, cid = item
    row = {
        "cell_id": cid,
        **_identity(grid.model, lm.checksum, grid, record, order, setting, query),
        "n_prefix": prompt.n_tokens,
        "span_tokens": {span.name: len(span) for span in prompt.spans},
        **{f"keep_{k}": v for k, v in metrics.keep_rates(compressed.kept, prompt.spans, prompt.n_tokens).items()},
        "prefill_s": prefilled.seconds,
        "cut_s": compressed.seconds,
        "versions": versions,
    }
    if reply is not None:
        row.update({"response": reply.text, "new_tokens": reply.n_tokens, "decode_s": reply.seconds})
        row.update(
            metrics.benign_scores(record, reply.text)
            if query == "benign"
            else metrics.attack_scores(prompt.references, reply.text, prompt.raw_references)
        )
    return row


def _collect(grid: Grid, records, done: dict[str, dict], checksum) -> pd.DataFrame:
    rows = []
    for record in records:
        for order in grid.orders:
            for policy, variant, lam, ratio in grid.requested():
                setting = canonical(policy, variant, lam, ratio)
                for query in grid.queries:
                    row = done[cell_id(_identity(grid.model, checksum, grid, record, order, setting, query))]
                    rows.append({**row, "policy": policy, "variant": variant, "lam": lam, "ratio": ratio})
    return pd.DataFrame(rows)
