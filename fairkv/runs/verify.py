"""Recompute stored rows from scratch and say how many come out identical (``fairkv verify --sample K``).

A committed results store (``results/cpu/``) is only as good as the claim that this code computes it. ``verify`` draws
K rows at random (seeded), rebuilds each row's one-cell grid from its identity (model, precision, dataset and prompt,
order, setting, query, token budget, template), computes it in an empty store with the stored model and precision,
and compares every field except timings and library stamps (``IGNORED``): the response, the keep rates and every
score. The rebuilt cell must have the stored cell id, so a row whose identity this code cannot rebuild is an error,
not a mismatch.

Rows computed by other result code (another ``versions["code"]``, ``fairkv.runs.fingerprint``) are refused: this code
cannot vouch for them. A cell recomputed alone decodes in a batch of one, while the sweep decoded it in a running batch
of up to ``batch_size`` answers: in bfloat16 a batch's shape changes how matmuls round, so a response can part from the
stored one where two tokens were (nearly) tied. Such a row is a *near tie*, not a defect: everything but the response
and what is scored from it agrees, and at the first token where the two responses part, the stored token's logit is
within ``TIE_STEPS`` rounding steps of the row's precision of the recomputed token's (the logits of the response's
common beginning, teacher-forced on the recomputed cache). The cpu profile's ``fairkv verify --sample 20`` found 17
identical and 3 near ties, each 0 or 1 bfloat16 step apart (``' instructions'`` vs ``' request'`` at 16.875 vs 16.75);
float32 rows recompute exactly (``tests/test_verify.py``). Any other difference (a keep rate, a response that parts
where one token clearly led) is reported as differing, and the command exits with status 1. A judge's score
(``fairkv.runs.judge``) is recomputed from the secret and response its row keeps; alone rather than in a batch of 8,
its digit must be the same and its continuous columns within ``JUDGE_TOLERANCE``.

bfloat16 rounds by the CPU's kernels too: the committed cpu sweep and atlas rows were computed with oneDNN's AVX512-BF16
kernels (AMD Zen 4), the judge's 1,600 scores with AMX (capped, 2 of 20 sampled changed their digit). On an Intel CPU
with AMX, oneDNN's default AMX kernels round differently (1,056 of 1,584 keep-rate rows of four prompts in both orders
differed in a keep rate), and capped to the AVX512-BF16 kernels those of one recompute identically (396 of 396): there,
verify the sweep's and the atlas's rows as ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 fairkv verify ...`` (issue 49;
``benchmarks/results/restamp_issue49.txt``). Every row now records its arithmetic (``fairkv.core.arithmetic``: the
device, precision and kernel family, or emulated bfloat16): where this process computes with the row's, the comparison
is bit for bit as above; where not, each kind of row is judged by ``fairkv.runs.tolerance``'s stated rule (keep rates
within a measured bound, decoded answers agreeing at least as often as two native decodes do, scores always equal to
the stored response's), and the report names the rule it applied.
"""

from __future__ import annotations

import copy
import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from fairkv.core import arithmetic, data, generation, metrics, models, per_setting, prompts, score_once
from fairkv.core.attention import decoding
from fairkv.core.presses import Setting, canonical
from fairkv.core.presses.registry import runnable
from fairkv.core.progress import Bar
from fairkv.runs import atlas, experiment, fingerprint, judge, operative, tolerance
from fairkv.runs.store import ResultsStore

# timings and stamps: never equal twice (the arithmetic a row was computed with: which rule judges it)
IGNORED = {"prefill_s", "cut_s", "decode_s", "prompt_s", "versions", "schema", arithmetic.FIELD}
TIE_STEPS = 2  # a near tie: the two tokens' logits at most this many rounding steps of the precision apart
SWEEP_IDENTITY = {"dataset", "key", "order", "policy", "variant", "lam", "ratio", "query", "max_new_tokens", "dtype"}
COMPRESSION = ("n_prefix", "span_tokens", "keep_")  # fields (and prefixes) a near tie never changes
# the versions fields that name the code that computed a row (fingerprint)
STAMPS = ("code", "atlas", "judge", "operative")
# a judge's score recomputed alone against one judged in a batch of 8 (bfloat16 rounds by the batch's shape): its
# expected severity (0-4) and its mass on the digits may move by this much, its digit and leak call never. Measured on
# 20 committed cpu rows: every digit equal, the expected severity moved by up to 0.054, the mass by up to 0.0002
JUDGE_TOLERANCE = {"judge_expected": 0.1, "judge_mass": 0.01}


class VerifyError(ValueError):
    """Rows that cannot be recomputed by this code."""


@dataclass
class Report:
    store: str
    sampled: int
    now: dict = field(default_factory=dict)  # this checkout's stamp for the store's kind of row
    identical: int = 0
    differing: dict[str, list[str]] = field(default_factory=dict)  # cell id -> fields that differ
    near_ties: dict[str, str] = field(default_factory=dict)  # differing cell id -> where its responses part, and why
    rules: dict[str, int] = field(default_factory=dict)  # the rule applied ("bitwise", or a tolerance) -> rows
    within: dict[str, str] = field(default_factory=dict)  # differing cell id of other arithmetic -> within its rule
    agreement: tolerance.Agreement = field(default_factory=tolerance.Agreement)  # decoded rows of other arithmetic
    misscored: dict[str, list[str]] = field(default_factory=dict)  # cell id -> scores its stored response does not give

    @property
    def defects(self) -> list[str]:
        """Rows whose stored response does not give their scores, and differing rows that neither a near tie (same
        arithmetic) nor their rule's tolerance (other arithmetic) explains."""
        unexplained = [cell for cell in self.differing if cell not in self.near_ties and cell not in self.within]
        return list(dict.fromkeys([*self.misscored, *unexplained]))

    @property
    def failed(self) -> bool:
        """A defective row, or decoded answers of other arithmetic agreeing less than two native decodes do."""
        return bool(self.defects or self.agreement.below())

    def __str__(self) -> str:
        rules = ", ".join(f"{rule} for {n}" for rule, n in self.rules.items())
        lines = [
            f"{self.store}: {self.identical} of {self.sampled} rows recomputed identically, "
            f"{len(self.near_ties)} differ after a near tie (within {TIE_STEPS} rounding steps; a judge's score: "
            f"within its tolerance), {len(self.within)} of other arithmetic differ within its tolerance "
            f"(fairkv.runs.tolerance), {len(self.defects)} differ otherwise",
            f"  rule applied: {rules}",
        ]
        if self.agreement.counts:
            lines.append(f"  decoded on other arithmetic: {self.agreement}")
        lines += [f"  below the native floor: {short}" for short in self.agreement.below()]
        for cell, fields in self.differing.items():
            why = self.near_ties.get(cell) or self.within.get(cell)
            lines.append(f"  {cell}: differs in {', '.join(fields)}{f': {why}' if why else ''}")
        lines += [
            f"  {cell}: its stored response scores otherwise in {', '.join(f)}" for cell, f in self.misscored.items()
        ]
        return "\n".join(lines)


def query_kind(row: dict) -> str:
    """A decoded row's kind of query: "benign", or "attack" for every attack query."""
    return "benign" if row["query"] == "benign" else "attack"


def stamp(versions: dict) -> str:
    """The code a row's ``versions`` name: its fingerprint, and beside it the atlas's for its keep rates or the
    operative words' for theirs; the judge's own for a judge's scores."""
    return "/".join(versions[name] for name in STAMPS if name in versions)


def cell_grid(row: dict) -> experiment.Grid:
    """The one-cell grid whose only cell is ``row``'s (its cell id is checked by ``verify``)."""
    keys = [record.key for record in data.load_records(row["dataset"])]
    if row["key"] not in keys:
        raise VerifyError(f"cell {row['cell_id']}: prompt {row['key']} is not in {row['dataset']}")
    tokens = max(1, int(row["max_new_tokens"]))  # keep rows decode nothing (0): any budget gives their identity
    return experiment.Grid(
        model=row["model"],
        dataset=row["dataset"],
        start=keys.index(row["key"]),
        n_prompts=1,
        orders=(row["order"],),
        policies=(row["policy"] if row["policy"] != "none" else "streamingllm",),
        variants=(row["variant"],),
        lams=(row["lam"],),
        ratios=(row["ratio"],),
        queries=(row["query"],),
        max_new_tokens=tokens,
        benign_tokens=tokens,
        int8=row["int8"],
        dtype=row["dtype"],
        template=row.get("template"),
        batch_size=1,
    )


def _load(row: dict) -> models.LoadedModel:
    return models.load_model(row["model"], int8=row.get("int8", False), dtype=getattr(torch, row["dtype"]))


@dataclass(frozen=True)
class Kind:
    """One kind of stored row: the versions this checkout stamps on it, how one row is computed afresh (in an empty
    folder, with the row's model loaded once per store: ``load``) into its store's rows by cell id, and whether it
    decodes."""

    name: str
    versions: Callable[[], dict]
    recompute: Callable[[dict, models.LoadedModel, Path], dict]
    decodes: bool
    load: Callable[[dict], models.LoadedModel] = _load


def _sweep(row: dict, lm: models.LoadedModel, folder: Path) -> dict:
    grid = cell_grid(row)
    experiment.run(grid, folder, progress=False, lm=lm)
    return experiment.store_for(grid, folder).rows()


def _keep_rates(row: dict, lm: models.LoadedModel, folder: Path) -> dict:
    record = next(r for r in data.load_records(row["dataset"]) if r.key == row["key"])
    prompt = prompts.paper_prompt(lm.tokenizer, record, data.load_defense_templates(), row["order"])
    ((keep, error),) = atlas.keep_rates(lm, prompt, runnable([row["press"]]), (row["ratio"],)).values()
    return {row["cell_id"]: {**row, "keep": keep, "error": error, "n_tokens": prompt.n_tokens}}


def _cache(lm: models.LoadedModel, prompt: prompts.Prompt, setting: Setting):
    """The cell's compressed cache as its backend builds it, and the attention it decodes with."""
    if experiment.built_per_setting(setting):
        compressed, _ = per_setting.compressed(lm, prompt, [setting])
        return compressed[setting], decoding(lm.model, masked=True)
    prefilled = score_once.prefill(lm, prompt, (setting.policy,) if setting.policy else ())
    return score_once.cut(prefilled, setting), decoding(lm.model)


def _operative(row: dict, lm: models.LoadedModel, folder: Path) -> dict:
    grid = cell_grid({**row, "query": "attack", "max_new_tokens": 1, "int8": False})
    operative.run(grid, folder, progress=False, lm=lm)
    return ResultsStore(operative.store_path(grid, folder)).rows()


def _judge(row: dict, lm: models.LoadedModel, folder: Path) -> dict:
    (scores,) = judge.score(lm, [(row["secret"], row["response"])])
    return {row["cell_id"]: {**row, **scores}}


SWEEP = Kind("grid rows (any press of the catalogue)", fingerprint.versions, _sweep, True)
KEEP_RATES = Kind("the press atlas's keep rates", atlas.versions, _keep_rates, False)
OPERATIVE = Kind("the operative words' keep rates", operative.versions, _operative, False)
JUDGE = Kind(
    "the judge's scores", judge.versions, _judge, False, lambda row: judge.load_judge(row["judge"], row["dtype"])
)


def kind_of(path: Path, rows: list[dict]) -> Kind:
    """The kind of ``rows``: the atlas's keep rates, the operative words' keep rates, the judge's scores, or a grid's
    rows."""
    if all(row.get("kind") == "atlas" for row in rows):
        return KEEP_RATES
    if all(row.get("kind") == operative.OPERATIVE for row in rows):
        return OPERATIVE
    if all({"judge", "judged"} <= row.keys() for row in rows):
        return JUDGE
    strangers = sum(not SWEEP_IDENTITY <= row.keys() for row in rows)
    if strangers:
        raise VerifyError(
            f"{path}: {strangers} of {len(rows)} rows are neither a sweep's rows (no "
            f"{', '.join(sorted(SWEEP_IDENTITY))}) nor the atlas's keep rates nor a judge's scores"
        )
    return SWEEP


def differences(stored: dict, fresh: dict) -> list[str]:
    """The fields (other than ``IGNORED``) whose values differ, or that only one row has (NaN equals NaN; a dict's
    order does not count)."""
    names = (set(stored) | set(fresh)) - IGNORED
    text = lambda row, name: json.dumps(row.get(name, "<missing>"), sort_keys=True)
    same = lambda name: text(stored, name) == text(fresh, name)
    return sorted(name for name in names if not same(name))


def verify(
    path: Path,
    sample: int,
    seed: int = 0,
    progress: bool = True,
    stamped: str | None = None,
    reading: Callable[[dict], str] | None = None,
) -> Report:
    """Recompute ``sample`` random rows of the store at ``path`` (all if fewer) and compare them field by field: bit
    for bit where this process computes with the arithmetic a row records, by ``fairkv.runs.tolerance``'s rule where it
    does not (``reading``: what a decoded answer says, ``fairkv.report.outcomes.reading``, needed there). The rows must
    carry this checkout's stamp for their kind, or ``stamped`` (``restamp``'s check)."""
    store = ResultsStore(path)
    if Path(path).is_dir():
        raise VerifyError(f"{path} is a folder: name a store in it (its <model>.jsonl)")
    if not store.path.exists() and not store.segments():
        raise VerifyError(f"{path}: no such store (no file, nor sealed segments of it beside it)")
    rows = list(store.rows().values())
    if not rows:
        raise VerifyError(f"{path} holds no rows")
    kind = kind_of(path, rows)
    now = {name: value for name, value in kind.versions().items() if name in STAMPS}
    rows = _to_check(path, rows, now, stamped)
    chosen = random.Random(seed).sample(rows, min(sample, len(rows)))
    report = Report(str(path), len(chosen), now)
    loaded = {}
    bar = Bar(total=len(chosen), desc="verified", unit="row", disable=not progress)
    with tempfile.TemporaryDirectory(prefix="fairkv-verify-") as scratch:
        for row in chosen:
            model = (row.get("model", row.get("judge")), row["dtype"], row.get("int8", False))
            lm = loaded.get(model) or kind.load(row)
            loaded[model] = lm
            with arithmetic.emulation(lm):
                fresh = kind.recompute(row, lm, Path(scratch) / row["cell_id"])
            if row["cell_id"] not in fresh:
                raise VerifyError(
                    f"cell {row['cell_id']}: its rebuilt grid computes cell(s) {sorted(fresh)}; this "
                    "code cannot rebuild the row's identity"
                )
            _compare(report, kind, lm, row, fresh[row["cell_id"]], reading)
            bar.update(1)
    bar.close()
    return report


def current(row: dict, now: dict) -> bool:
    """The row carries the stamps of this checkout's code ``now`` (``STAMPS``) and of the press it ran."""
    stamps = lambda versions: {name: versions.get(name) for name in (*STAMPS, "press")}
    return stamps(row.get("versions", {})) == stamps(fingerprint.expected(now, row))


def _to_check(path: Path, rows: list[dict], now: dict, stamped: str | None) -> list[dict]:
    """The rows ``verify`` samples: every row, which must carry this checkout's stamps (``now``); with ``stamped``
    (``restamp``'s check), the rows of code ``stamped`` that lack them (another press stamp, or none), while every
    other row must carry them."""
    stale = [row for row in rows if stamped and stamp(row.get("versions", {})) == stamped and not current(row, now)]
    foreign = len(rows) - len(stale) - sum(current(row, now) for row in rows)
    if foreign:
        code = (
            f"the stamp {stamped} or this checkout's ({stamp(now)})" if stamped else f"this checkout's ({stamp(now)})"
        )
        raise VerifyError(
            f"{path}: {foreign} of {len(rows)} rows were computed by other result code than {code}, or by another "
            "press than their stamp's (fairkv.runs.fingerprint); check out the code that computed them"
        )
    if stamped and not stale:
        raise VerifyError(f"{path}: no row stamped {stamped} lacks this checkout's stamps: nothing to restamp")
    return stale if stamped else rows


def _compare(report: Report, kind: Kind, lm, row: dict, fresh: dict, reading) -> None:
    """Add one recomputed row to ``report``, by the rule of the arithmetic it was stored with against this process's."""
    here, stored = arithmetic.path(lm), row.get(arithmetic.FIELD, "unrecorded")
    rule = "bitwise" if stored == here else f"tolerance ({stored} -> {here})"
    report.rules[rule] = report.rules.get(rule, 0) + 1
    cell, changed = row["cell_id"], differences(row, fresh)
    decoded = kind.decodes and "response" in row  # a grid's keep rows decode nothing
    scores = _scores(lm, row) if decoded else {}  # this code's scores of the stored response
    if decoded:
        misscored = differences({name: row.get(name, "<missing>") for name in scores}, scores)
        if misscored:
            report.misscored[cell] = misscored
        if rule != "bitwise":
            if reading is None:
                raise VerifyError(f"{report.store}: decoded rows of other arithmetic need a reading to compare")
            same = row["response"] == fresh["response"]
            report.agreement.add(query_kind(row), same, same or reading(row) == reading(fresh))
    if not changed:
        report.identical += 1
        return
    report.differing[cell] = changed
    if kind is JUDGE and set(changed) <= JUDGE_TOLERANCE.keys():
        alike = _judged_alike(row, fresh)
        if alike:
            report.near_ties[cell] = alike
    elif rule == "bitwise" and decoded and _response_only(changed):
        tie = near_tie(lm, row, fresh["response"])
        if tie:
            report.near_ties[cell] = tie
    elif rule != "bitwise":
        within = _within_tolerance(scores, row, fresh, changed)
        if within:
            report.within[cell] = within


def _within_tolerance(scores: dict, row: dict, fresh: dict, changed: list[str]) -> str | None:
    """How a row recomputed with other arithmetic differs, if only as ``fairkv.runs.tolerance`` allows: keep rates
    within ``KEEP_BOUND``, and a parted answer with what is scored from it (``scores``, the stored response's, checked
    apart; none for a row that decodes nothing)."""
    moved = tolerance.keep_moved(row, fresh)
    scored = set(scores) | ({"response", "new_tokens"} if scores else set())
    rest = [name for name in changed if not tolerance.is_keep_field(name) and name not in scored]
    if rest or moved > tolerance.KEEP_BOUND:
        return None
    parts = [f"keep rates within {moved:.4f} (bound {tolerance.KEEP_BOUND})"] if moved else []
    return ", ".join(parts + (["the answer parted"] if "response" in changed else []))


def _scores(lm, row: dict) -> dict:
    """The scores this code gives the row's stored response."""
    record = next(r for r in data.load_records(row["dataset"]) if r.key == row["key"])
    if row["query"] == "benign":
        return metrics.benign_scores(record, row["response"])
    prompt = prompts.prompt_for(lm.tokenizer, record, data.load_defense_templates(), row["order"], row.get("template"))
    return metrics.attack_scores(prompt.references, row["response"], prompt.raw_references)


def restamp(
    path: Path, was: str, sample: int = 20, seed: int = 0, progress: bool = True, reading=None
) -> tuple[Report, int]:
    """Give the rows of ``path`` stamped ``was`` this checkout's stamps (the code's, and each row's press's), after
    ``verify`` recomputed ``sample`` of the rows that lack them with this checkout's code and none failed its rule
    (bitwise but for near ties on the arithmetic the rows record, ``fairkv.runs.tolerance`` on other arithmetic: the
    report names the rule and the path): for a change of code that keeps what rows hold (a new fingerprint, a
    refactoring, one press's edit) without computing them again. Returns the verification and the rows restamped; a
    failure is an error and nothing is written."""
    report = verify(path, sample, seed, progress, stamped=was, reading=reading)
    if report.failed:
        raise VerifyError(f"{report}\n{path}: rows differ, so they keep their stamp {was}: compute them again")
    now = report.now

    def change(row: dict) -> dict | None:
        versions = row.get("versions", {})
        if stamp(versions) != was or current(row, now):
            return None
        versions = {**versions, **{name: now[name] for name in STAMPS if name in versions}}
        return {**row, "versions": fingerprint.expected({k: v for k, v in versions.items() if k != "press"}, row)}

    return report, ResultsStore(path).restamp(change)


def _judged_alike(stored: dict, fresh: dict) -> str | None:
    """How a judge's score recomputed with the same digit differs in its continuous columns, if only within
    ``JUDGE_TOLERANCE`` (the rounding of another batch)."""
    moved = {name: abs(stored[name] - fresh[name]) for name in JUDGE_TOLERANCE}
    if any(moved[name] > JUDGE_TOLERANCE[name] for name in moved):
        return None
    return ", ".join(f"{name} {stored[name]:.4f} vs {fresh[name]:.4f}" for name in moved if moved[name]) + (
        " (alone vs in a batch: bfloat16 rounding)"
    )


def _response_only(changed: list[str]) -> bool:
    """Only the response and what is scored from it differ; the compression agrees."""
    return "response" in changed and not any(name.startswith(COMPRESSION) for name in changed)


@torch.inference_mode()
def near_tie(lm, row: dict, response: str) -> str | None:
    """Where the stored response and the recomputed ``response`` part, if their tokens there are a near tie.

    The cell's cache is rebuilt as its rows were built (``_cache``: by its press's backend, decoded with masked heads
    for the per-setting one); the query and the responses' common beginning run over a copy of it, and the two tokens' logits at the next position are compared in rounding steps of
    the row's precision at the larger logit's magnitude. A response that ended first parts at an end-of-turn token.
    """
    grid, tokenizer = cell_grid(row), lm.tokenizer
    templates, attacks = data.load_defense_templates(), grid.attacks()
    record = next(r for r in data.load_records(row["dataset"]) if r.key == row["key"])
    prompt = prompts.prompt_for(tokenizer, record, templates, row["order"], grid.template)
    setting = canonical(row["policy"], row["variant"], row["lam"], row["ratio"])
    compressed, attention = _cache(lm, prompt, setting)
    query = prompt.query_ids({**attacks, "benign": None}[row["query"]] or record.user)
    stored, fresh = (tokenizer(text, add_special_tokens=False).input_ids for text in (row["response"], response))
    part = next((i for i, (a, b) in enumerate(zip(stored, fresh)) if a != b), min(len(stored), len(fresh)))
    ids = torch.cat([query, torch.tensor([fresh[:part]], dtype=torch.long)], dim=1).to(lm.device)
    copied = copy.deepcopy(compressed.cache)
    positions = torch.arange(prompt.n_tokens, prompt.n_tokens + ids.shape[1], device=lm.device)[None]
    mask = torch.ones(1, copied.get_seq_length() + ids.shape[1], dtype=torch.long, device=lm.device)
    with attention:
        output = lm.model(
            input_ids=ids, past_key_values=copied, position_ids=positions, attention_mask=mask, logits_to_keep=1
        )
    logits = output.logits[0, -1].float()
    end = max(generation.stop_token_ids(lm), key=lambda token: logits[token].item())
    a, b = (tokens[part] if part < len(tokens) else end for tokens in (stored, fresh))
    step = torch.finfo(getattr(torch, row["dtype"])).eps * 2.0 ** torch.floor(torch.log2(logits[[a, b]].abs().max()))
    steps = abs(logits[a] - logits[b]).item() / step.item()
    if steps > TIE_STEPS:
        return None
    return (
        f"token {part}: {tokenizer.decode([a])!r} (stored) vs {tokenizer.decode([b])!r} (recomputed), logits "
        f"{logits[a].item():.4g} vs {logits[b].item():.4g}, {steps:.0f} {row['dtype']} "
        f"step{'' if round(steps) == 1 else 's'} apart"
    )
