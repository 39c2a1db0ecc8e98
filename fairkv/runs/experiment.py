"""Declarative sweeps: a grid of settings run prompt by prompt into the results store, resumable at any point.

A ``Grid`` names the model, a slice of sys_ifeval, orders, policies (any press of the catalogue,
``presses.registry.REGISTRY``), variants, lambdas, ratios and query kinds. Each (prompt, order, setting, query) is one
row of the store, keyed by a hash of what determines it (model checksum, int8, prompt, setting, query,
max_new_tokens, metrics version), so a cell requested by two notebooks or twice by one is computed once. Settings
are canonical: r = 0 is one cell ("none") shared by every policy and variant, fair with lam = 0 is the base selection,
and lam only matters for fair variants.

``run`` hands the grid's cells to the one runner (``fairkv.runs.runner``) as a ``Job``. Per prompt and order each
missing setting is built by its press's backend: the score-once presses from one prefill that scores them all
(``score_once.prefill``, each setting cut from it by ``score_once.cut``), the per-setting ones by each press's own
``compress`` on one prefill (``per_setting.compressed``). Each prompt's missing (cache, query) pairs join one running
decode batch (``generation.Decoder``; the per-setting caches one of their own, with masked heads) that the next
prompts' pairs keep full, and rows are appended as their answers land, so a killed run loses at most the answers in
flight and recomputes nothing finished.

The profiles' grids (``ci``, ``cpu``, ``paper``) are ``fairkv.runs.studies``'; each study's scale on top of them is
in its module of ``fairkv.studies``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pandas as pd
import torch

from fairkv.core import data, generation, metrics, models, per_setting, prompts, score_once
from fairkv.core.paths import REDECODED_FOLDER, redecoded, results_dir
from fairkv.core.presses import PAPER, Setting, Variant, canonical, check_lam, check_ratio, get_policy, rates
from fairkv.core.presses.policy import PER_SETTING
from fairkv.core.presses.registry import provenance
from fairkv.core.progress import note as progress_note
from fairkv.runs import fingerprint, runner
from fairkv.runs.store import ResultsStore

# keep: no decoding, the row holds the keep rates and timings only; "attack" is the paper's attack, and any
# RaccoonBench attack is a query kind of its own, "attack:<suite>/<category>/<name>" (data.attack_query)
QUERIES = ("benign", "attack", "keep")
DTYPES = ("float32", "bfloat16", "float16")  # the model's precision; part of every cell's identity
TASK_BATCHES = 3  # a task (what a Ray worker is handed at a time) holds about this many decode batches


class GridError(ValueError):
    """A grid or profile that cannot be run as asked."""


@dataclass(frozen=True)
class Grid:
    """What to run. ``max_new_tokens`` applies to both queries (the paper: 1280 benign, 256 attack)."""

    model: str = models.DEFAULT_MODEL
    dataset: str = "sys_ifeval_shuffled"
    start: int = 0
    n_prompts: int | None = 4
    orders: tuple[str, ...] = ("normal",)
    policies: tuple[str, ...] = PAPER
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
            Variant(variant)
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
        lams = lambda variant: self.lams if Variant(variant).fair else (1.0,)
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


def cell_id(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def _identity(
    lm_name: str, checksum: str | None, grid: Grid, record, order, setting: Setting, query: str
) -> dict:  # 7 parameters: each a field of the cell's identity
    return {
        "model": lm_name,
        "checksum": checksum,
        "int8": grid.int8,
        "dtype": grid.dtype,
        "dataset": grid.dataset,
        "key": record.key,
        "order": order,
        "policy": setting.policy or "none",
        **provenance(setting.policy),  # a press of one's own: its source (kvpress's: nothing, ids unchanged)
        "variant": setting.variant,
        "lam": setting.lam,
        **({"share": setting.share} if setting.variant.boundary else {}),  # boundary protection's alone: ids unchanged
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
class Item:
    """One missing cell of a task, once its cache is built: what its row is made of."""

    record: object
    order: str
    prompt: prompts.Prompt
    prefill_s: float
    setting: Setting
    compressed: generation.Compressed
    query: str
    cell_id: str

    @property
    def masked(self) -> bool:
        """Its cache marks keys evicted per head (the per-setting backend's)."""
        return built_per_setting(self.setting)


def built_per_setting(setting: Setting) -> bool:
    """The setting's press is built per setting (``presses.policy.PER_SETTING``); r = 0 is the uncompressed cache."""
    return setting.policy is not None and get_policy(setting.policy).backend == PER_SETTING


@dataclass(frozen=True)
class Job:
    """A grid's cells for ``runner.run``: the grid, its prompts, the model's checksum, the defense templates, the
    attacks and the library versions the rows are stamped with. Executors call ``compute`` on their own loaded model
    (``load``), in this process or a Ray worker's."""

    grid: Grid
    records: tuple
    checksum: str | None
    templates: dict
    attacks: dict[str, str]  # query kind -> attack text
    versions: dict

    def load(self, device: str | None = None) -> models.LoadedModel:
        return models.load_model(
            self.grid.model, int8=self.grid.int8, dtype=getattr(torch, self.grid.dtype), device=device
        )

    def model_key(self) -> tuple:
        return (self.grid.model, self.grid.int8, self.grid.dtype)

    def cells(self) -> dict[tuple, str]:
        """(record, order, setting, query) -> cell id, for every distinct cell of the grid."""
        grid = self.grid
        return {
            (record, order, s, q): cell_id(_identity(grid.model, self.checksum, grid, record, order, s, q))
            for record in self.records
            for order in grid.orders
            for s in grid.settings()
            for q in grid.queries
        }

    def tasks(self, missing: list[tuple]) -> list[list]:
        """Groups of (record, order, missing (setting, query) pairs, their cell ids): enough prompts for
        ``TASK_BATCHES`` decode batches of their settings' queries, so Ray workers get tasks of a useful size (this
        process runs them all in one pass, ``compute``); a prompt's settings and queries never straddle two tasks
        (they share one prefill)."""
        grid, ids = self.grid, self.cells()
        todo: dict[tuple, list] = {}
        for record, order, s, q in missing:
            todo.setdefault((record, order), []).append((s, q))
        units = [(record, order) for record in self.records for order in grid.orders]
        decoded = max(1, sum(query != "keep" for query in grid.queries))
        group = max(1, TASK_BATCHES * grid.batch_size // (len(grid.settings()) * decoded))
        tasks = []
        for first in range(0, len(units), group):
            task = [
                (
                    record,
                    order,
                    todo[(record, order)],
                    {(s, q): ids[(record, order, s, q)] for s, q in todo[(record, order)]},
                )
                for record, order in units[first : first + group]
                if (record, order) in todo
            ]
            if task:
                tasks.append(task)
        return tasks

    def compute(self, lm: models.LoadedModel, tasks: list) -> Iterator[list[dict]]:
        """Rows for the missing (setting, query) pairs of ``tasks``, yielded prompt by prompt as they land. Each
        prompt's settings are built by their backend (score-once: one prefill scores every policy, each setting cut
        from it; per-setting: one prefill, each press's own ``compress`` per setting); its queries join one running
        decode batch of ``grid.batch_size`` sequences (``generation.Decoder``; the per-setting caches one of their
        own, with masked heads), each with its own token budget, that the next prompts' queries keep full across
        tasks: the next prompt is built when the batch has room its waiting queries cannot fill."""
        grid, rows, decoding = self.grid, [], {}  # decoding: cell id -> its item, until its answer lands
        text = {**self.attacks, "benign": None}
        decoders = {masked: generation.Decoder(lm, grid.batch_size, masked=masked) for masked in (False, True)}
        units = [unit for task in tasks for unit in task]
        for number, unit in enumerate(units, start=1):
            progress_note(f"prefilling prompt {number} of {len(units)}")
            for item in self._items(lm, unit):
                if item.query == "keep":
                    rows.append(_row(grid, lm, item, self.versions))
                else:
                    query = item.prompt.query_ids(text[item.query] or item.record.user)
                    budget = grid.tokens_for(item.query)
                    decoding[item.cell_id] = item
                    decoders[item.masked].add(generation.Request(item.cell_id, item.compressed, query, budget))
            for decoder in decoders.values():
                for cell, reply in decoder.answers(drain=False):
                    rows.append(_row(grid, lm, decoding.pop(cell), self.versions, reply))
            if rows:
                yield rows
                rows = []
        for decoder in decoders.values():
            for cell, reply in decoder.answers(drain=True):
                rows.append(_row(grid, lm, decoding.pop(cell), self.versions, reply))
                if len(rows) >= grid.batch_size // 4:
                    yield rows
                    rows = []
        if rows:
            yield rows

    def _items(self, lm: models.LoadedModel, unit: tuple) -> list[Item]:
        """The missing cells of one (record, order), their caches built."""
        record, order, missing, ids = unit
        grid = self.grid
        prompt = prompts.prompt_for(lm.tokenizer, record, self.templates, order, grid.template)
        settings = list(dict.fromkeys(s for s, _ in missing))
        each = [s for s in settings if built_per_setting(s)]
        once = [s for s in settings if not built_per_setting(s)]
        built = {}  # setting -> (prefill seconds, its compressed cache)
        if once:
            policies = tuple(dict.fromkeys(s.policy for s in once if s.policy is not None))
            prefilled = score_once.prefill(lm, prompt, policies)
            for s in once:
                built[s] = (prefilled.seconds, score_once.cut(prefilled, s))
        if each:
            caches, prefill_s = per_setting.compressed(lm, prompt, each)
            built.update({s: (prefill_s, caches[s]) for s in each})
        return [Item(record, order, prompt, built[s][0], s, built[s][1], q, ids[(s, q)]) for s, q in missing]


def run(
    grid: Grid,
    folder: Path | None = None,
    progress: bool = True,
    lm: models.LoadedModel | None = None,
    executor="serial",
    wait: bool = True,
) -> pd.DataFrame:
    """Compute what the store lacks for ``grid`` and return the grid's rows (one per prompt, order, setting label
    and query; r = 0 rows repeated under every policy and variant), through ``runner.run``.

    Any press of the registry is a policy (``presses.registry.REGISTRY``); each setting is built by its press's
    backend. ``executor``: "serial" (this process; ``lm`` reuses a loaded model), "ray" (a Ray cluster:
    ``RAY_ADDRESS`` or a local one), or a spec (``{"kind": "ray", "address": ..., "workers": ...}``, see
    ``fairkv.runs.executors``). ``wait``: when another process computes the same store, wait for it and reuse its rows
    (False: raise ``StoreBusy`` naming it)."""
    if lm is not None and lm.model.dtype != getattr(torch, grid.dtype):
        raise GridError(
            f"the model passed in runs in {lm.model.dtype}, the grid asks for {grid.dtype}: rows of "
            "another precision are never mixed; load it with that dtype or set the grid's dtype"
        )
    records = data.load_records(grid.dataset)
    records = records[grid.start : grid.start + grid.n_prompts if grid.n_prompts is not None else None]
    if not records:
        raise GridError(f"the slice start={grid.start}, n_prompts={grid.n_prompts} of {grid.dataset} is empty")
    checksum = lm.checksum if lm is not None else _checksum(grid.model)
    job = Job(grid, tuple(records), checksum, data.load_defense_templates(), grid.attacks(), fingerprint.versions())
    done = runner.run(job, store_for(grid, folder), executor, lm, progress, wait)
    return _collect(grid, records, done, checksum)


def cell_ids(grid: Grid) -> set[str]:
    """The ids of every cell ``grid`` reads (as ``run`` computes them)."""
    records = data.load_records(grid.dataset)
    records = records[grid.start : grid.start + grid.n_prompts if grid.n_prompts is not None else None]
    return set(Job(grid, tuple(records), _checksum(grid.model), {}, {}, {}).cells().values())


def decoded_again(grid: Grid, folder: Path | None, rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (``run``'s, of ``grid`` in ``folder``) with, under ``FAIRKV_REDECODED=1``, every cell that the folder's
    redecoded store holds (``fairkv.runs.redecode``: decoded again under another batch plan) read from there, checked
    against this code as the store's own rows are; the rows as they are otherwise."""
    if not redecoded() or rows.empty:
        return rows
    store = store_for(grid, Path(folder or results_dir()) / REDECODED_FOLDER)
    cells = set(rows["cell_id"])
    again = {cell: row for cell, row in store.rows().items() if cell in cells}
    versions = fingerprint.versions()
    for row in again.values():
        runner.check_versions(row, fingerprint.expected(versions, row), store)
    labels = ("policy", "variant", "lam", "ratio")  # the grid's names for the cell, as ``_collect`` gives them
    return pd.DataFrame(
        [
            {**again[row["cell_id"]], **{k: row[k] for k in labels}} if row["cell_id"] in again else row
            for row in rows.to_dict("records")
        ]
    )


def _row(grid: Grid, lm, item: Item, versions: dict, reply: generation.Answer | None = None) -> dict:
    """One store row: identity, keep rates, timings and (for a decoded query) the response and its scores."""
    prompt, compressed = item.prompt, item.compressed
    row = {
        "cell_id": item.cell_id,
        **_identity(grid.model, lm.checksum, grid, item.record, item.order, item.setting, item.query),
        "n_prefix": prompt.n_tokens,
        "span_tokens": {span.name: len(span) for span in prompt.spans},
        **{f"keep_{k}": v for k, v in rates.keep_rates(compressed.kept, prompt.spans, prompt.n_tokens).items()},
        "prefill_s": item.prefill_s,
        "cut_s": compressed.seconds,
        "versions": fingerprint.stamped(versions, item.setting.policy),
    }
    if reply is not None:
        row.update({"response": reply.text, "new_tokens": reply.n_tokens, "decode_s": reply.seconds})
        row.update(
            metrics.benign_scores(item.record, reply.text)
            if item.query == "benign"
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
