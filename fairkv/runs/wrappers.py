"""Whitelist and fair eviction for the presses the score-once engine cannot take, and their attack side (beyond the
paper).

After LagKV, the most biased presses of the atlas (notebook 12) are kvpress's wrappers around SnapKV: CriticalKV,
Block64, AdaKV and CriticalAdaKV. The engine scores a press once and cuts the top-k of those scores at every ratio
(``fairkv.core.score_once``); these presses do not work that way: AdaKV and CriticalAdaKV keep a different number of tokens in
each KV head (one top-k over heads x tokens), CriticalKV's two-stage score reads the ratio, Block scores the prefix
block by block, LeverageScore and Compactor draw a sketch at every call. Here each press is run by its own kvpress
``compress`` at each (variant, ratio) on the one uncompressed prefill of a prompt (``atlas.press_mask``; no press is
re-implemented), and the mitigations change only what Section 5 and Appendix F change:

- whitelist (Section 5.1): the whitelisted tokens score the dtype's maximum in the score the press selects by (its
  own when it is a ``ScorerPress``, as CriticalKV, else its inner press's), so the press's own rule keeps them
  (AdaKV's top-k over heads, Block's top-k in each block). A whitelist larger than the budget is an error
  (``selection.check_whitelist``), and so is a kept set that lacks a whitelisted token. Positions are found by their
  keys: Block scores subsets of the prefix, and keys are distinct copies (as in ``atlas.kept_mask``).
- fair eviction (Algorithm 1; Appendix F: "one span's queries never score another span's keys"): each span gets its
  share of the press's kept total (``budget.fair_budgets``, whitelisted tokens counted inside their span) and keeps
  what the press keeps when that span is the whole prompt at that budget (``anypress.span_as_prompt``: the span's
  hidden states, its keys re-rotated to start at 0, its values). AdaKV's top-k over heads x tokens runs inside each
  span with the span's budget times the heads, so its head-wise adaptation stays, within the span.

Head-masked caches: a kept set that differs per head cannot be gathered into one cache. As kvpress does for AdaKV
(``masked_key_indices``), the compressed cache keeps every position and the evicted ones receive no attention: their
keys are stored as NaN, a mark that travels with the cache through the running decode batch, and
``head_masked_attention`` (``attention.grouped_attention`` with the marked keys masked per KV head) gives them weight
zero. Every row here decodes that way, whatever the press; decoding otherwise is ``generation.answer_batch``.

Rows: ``attack`` computes an ``atlas.attack_grid`` of presses ``register``-ed here with the sweep's cell identities,
task plan, row fields and collection (``fairkv.runs.experiment``), one prefill per prompt for every setting, into a store
of their own (``store_path``) whose rows carry the sweep's fingerprint extended by the definitions ``attack`` and
``register`` reach (``versions``): never mixed with the engine's rows. They run at the grid's precision, the profile's as for
every other row (cpu: bfloat16). bfloat16 against float32 on notebook 12's four wrapped presses, in time per prompt
and refusals, is ``benchmarks/wrappers_precision.py``'s to measure (``benchmarks/results/wrappers_precision_qwen.txt``):
on a CPU without bfloat16 arithmetic ``dtype="float32"`` is the faster choice, a precision of its own (part of every
cell's identity, so never mixed with bfloat16 rows).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch
from kvpress import BasePress, ScorerPress
from kvpress.utils import compute_n_kept
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

from fairkv.core import data, generation, models, prompts
from fairkv.core.attention import grouped_attention
from fairkv.core.presses import registry
from fairkv.core.presses.budget import fair_budgets
from fairkv.core.presses.selection import check_whitelist
from fairkv.core.progress import Bar, note
from fairkv.runs import anypress, atlas, executors, experiment, fingerprint
from fairkv.runs.store import ResultsStore

HEAD_MASKED = "fairkv_head_masked"


def head_masked_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """``grouped_attention`` where keys marked NaN (evicted in that KV head) get weight zero: the attention mask
    (batch, 1, q, L) becomes (batch, kv_heads, q, L), the dtype's minimum at the marked positions."""
    evicted = key.isnan().any(-1)  # (batch, kv_heads, L)
    if evicted.any():
        batch, kv_heads, length = evicted.shape
        key = key.masked_fill(evicted.unsqueeze(-1), 0.0)
        if attention_mask is None:
            attention_mask = query.new_zeros(batch, 1, query.shape[2], length)
        attention_mask = attention_mask[..., :length].expand(batch, kv_heads, -1, length)
        attention_mask = attention_mask.masked_fill(evicted.unsqueeze(2), torch.finfo(attention_mask.dtype).min)
    return grouped_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


AttentionInterface.register(HEAD_MASKED, head_masked_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(HEAD_MASKED, eager_mask)


@contextmanager
def head_masking(model):
    """Decode ``model`` with ``head_masked_attention`` inside the block (``attention.decoding`` leaves a kernel that is
    not eager as it is), and with its own attention after it."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = HEAD_MASKED
    try:
        yield
    finally:
        config._attn_implementation = before


def _protect(press: BasePress, protected_keys: torch.Tensor) -> BasePress:
    """``press`` with its selecting score (its own for a ``ScorerPress``, else its inner press's) raised to the dtype's
    maximum at the keys ``protected_keys`` (batch, kv_heads, w, d): the whitelisted tokens, wherever they sit in the
    keys the score is given."""
    scorer = press if isinstance(press, ScorerPress) else getattr(press, "press", None)
    if not isinstance(scorer, ScorerPress):
        raise atlas.AtlasError(f"{type(press).__name__} has no score to whitelist by (not a ScorerPress, no inner one)")
    score = scorer.score

    def protected_score(module, hidden_states, keys, values, attentions, kwargs):
        scores = score(module, hidden_states, keys, values, attentions, kwargs)
        hit = (keys.unsqueeze(3) == protected_keys.unsqueeze(2)).all(-1).any(-1)
        return scores.masked_fill(hit, torch.finfo(scores.dtype).max)

    scorer.score = protected_score
    return press


def press_mask(entry: atlas.Entry, ratio: float, protected, module, hidden_states, keys, values, kwargs, model):
    """(batch, kv_heads, n) kept positions of ``entry``'s press at ``ratio`` on the n tokens given, the positions
    ``protected`` scored first (the whitelist)."""
    press = entry.build(ratio)
    press.post_init_from_model(model)
    if protected:
        press = _protect(press, keys[:, :, list(protected)])
    return atlas.press_mask(press, module, hidden_states, keys, values, None, kwargs)


class _SpanKeeper:
    """What ``anypress.span_as_prompt`` scores each span with, span after span: ``press_mask`` of the span alone
    keeping its budget (at the ratio where kvpress's ``compute_n_kept`` gives it), as 1.0 (kept) / 0.0."""

    def __init__(self, entry: atlas.Entry, budgets: list[int], protected: list[tuple[int, ...]], model):
        self.entry, self.model, self.todo = entry, model, list(zip(budgets, protected))

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        budget, protected = self.todo.pop(0)
        batch, heads, length, _ = keys.shape
        if budget in (0, length):
            return torch.full((batch, heads, length), float(budget == length))
        ratio = 1.0 - (budget + 0.5) / length
        assert compute_n_kept(length, ratio) == budget, (budget, length, ratio)
        mask = press_mask(self.entry, ratio, protected, module, hidden_states, keys, values, kwargs, self.model)
        return mask.float()


def kept_mask(
    entry: atlas.Entry, variant: str, ratio: float, spans, protected, model, module, hidden_states, keys, values, kwargs
) -> torch.Tensor:
    """(batch, kv_heads, n) positions ``entry``'s press keeps in this layer in ``variant`` (base, whitelist, fair,
    fair+whitelist; see the module doc) at ``ratio``."""
    batch, heads, n, _ = keys.shape
    n_kept = compute_n_kept(n, ratio)
    whitelist = tuple(protected) if "whitelist" in variant else ()
    check_whitelist(whitelist, n, n_kept, False, ratio)
    if not variant.startswith("fair"):
        mask = press_mask(entry, ratio, whitelist, module, hidden_states, keys, values, kwargs, model)
    else:
        inside = [tuple(p - start for p in whitelist if start <= p < end) for start, end in spans]
        budgets = fair_budgets(n_kept, [end - start for start, end in spans], [len(w) for w in inside])
        keeper = _SpanKeeper(entry, budgets, inside, model)
        mask = anypress.span_as_prompt(keeper, module, hidden_states, keys, values, None, kwargs, spans).bool()
    if whitelist and not mask[..., list(whitelist)].all():
        raise atlas.AtlasError(f"{entry.label} ({variant}, r = {ratio}) evicted a whitelisted token")
    return mask


def kept_indices(mask: torch.Tensor) -> torch.Tensor:
    """(batch, kv_heads, k) kept positions of ``mask`` (batch, kv_heads, n), k the largest count over heads; a head that
    keeps fewer repeats its first position, so that ``metrics.keep_rates`` (a scatter) reads its exact set."""
    count = mask.sum(-1, keepdim=True)
    most = int(count.max())
    order = (~mask).int().argsort(dim=-1, stable=True)[..., :most]
    return torch.where(torch.arange(most) < count, order, order[..., :1])


class _Masks(BasePress):
    """Per layer, the kept mask of every (press, variant, ratio) asked, on the layer's uncompressed prefill; compresses
    nothing."""

    def __init__(self, settings: list[experiment.Setting], prompt: prompts.Prompt):
        self.settings, self.prompt = settings, prompt
        self.spans = tuple((s.start, s.end) for s in prompt.spans)
        self.masks: dict[experiment.Setting, list[torch.Tensor]] = {s: [] for s in settings}

    def post_init_from_model(self, model):
        self.model = model
        config = model.config  # CriticalKV reads config.head_dim, which Qwen2's config derives, not stores
        if not hasattr(config, "head_dim"):
            config.head_dim = config.hidden_size // config.num_attention_heads

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        for setting in self.settings:
            entry = entry_of(setting.policy)
            try:
                mask = kept_mask(
                    entry,
                    setting.variant,
                    setting.ratio,
                    self.spans,
                    self.prompt.protected,
                    self.model,
                    module,
                    hidden_states,
                    keys,
                    values,
                    kwargs,
                )
            except atlas.PRESS_FAILURES as error:
                raise atlas.AtlasError(
                    f"{entry.label} ({setting.variant}, r = {setting.ratio}) raised on this prompt "
                    f"in layer {module.layer_idx}: {error}"
                ) from error
            self.masks[setting].append(mask)
        return keys, values


@torch.inference_mode()
def compressed(lm: models.LoadedModel, prompt: prompts.Prompt, settings: list[experiment.Setting]):
    """({setting: ``generation.Compressed``}, the prefill's seconds) from one prefill of ``prompt``: head-masked caches
    (evicted keys NaN) and the kept positions of each setting; r = 0 (policy None) is the uncompressed cache."""
    collector = _Masks([s for s in settings if s.policy is not None], prompt)
    cache = DynamicCache()
    start = time.perf_counter()
    with collector(lm.model):
        lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
    prefill_s = time.perf_counter() - start
    out = {}
    for setting in settings:
        start = time.perf_counter()
        masked, kept = DynamicCache(), {}
        for layer, entry in enumerate(cache.layers):
            keys = entry.keys
            if setting.policy is not None:
                mask = collector.masks[setting][layer].to(keys.device)
                keys = keys.masked_fill(~mask.unsqueeze(-1), float("nan"))
                kept[layer] = kept_indices(mask.cpu())
            masked.update(keys, entry.values, layer)
        out[setting] = generation.Compressed(
            masked,
            prompt.n_tokens,
            kept,
            time.perf_counter() - start,
            setting.policy,
            setting.ratio,
            setting.variant,
            setting.lam,
        )
    return out, prefill_s


def entry_of(policy: str) -> atlas.Entry:
    """The catalog entry of a policy key ``register`` made."""
    for entry in atlas.runnable():
        if anypress.key(entry) == policy:
            return entry
    raise atlas.AtlasError(f"{policy!r} is no press of the atlas")


def _engine_refuses(entry: atlas.Entry):
    def build(ratio: float):
        raise atlas.AtlasError(
            f"{entry.label} cannot go through the score-once engine (it is not a ratio-free ScorerPress): "
            "fairkv.runs.wrappers.attack computes its rows"
        )

    return build


def register(names) -> list[str]:
    """Make ``names`` (kvpress class names or labels of the atlas, not the paper's five nor the engine's
    ``anypress.scorers``) policy keys that grids and tables know; return the keys. The engine refuses them with a
    clear error: their rows come from ``attack``."""
    chosen = atlas.runnable(names)
    for entry in chosen:
        if entry.paper or entry in anypress.scorers():
            raise atlas.AtlasError(
                f"{entry.label} is one the score-once engine takes: run it with fairkv.runs.experiment"
            )
        key = anypress.key(entry)
        registry.POLICIES[key] = registry.Policy(key, entry.label, _engine_refuses(entry), min_tokens=0)
    return [anypress.key(e) for e in chosen]


def versions() -> dict[str, str]:
    """The versions these rows carry: the sweep's fingerprint extended by that of ``fingerprint.WRAPPERS``."""
    return {
        **fingerprint.versions(),
        "code": f"{fingerprint.of(fingerprint.SWEEP)}+{fingerprint.of(fingerprint.WRAPPERS)}",
    }


def store_path(grid: experiment.Grid, folder: Path) -> Path:
    """The store of these rows in ``folder`` (the atlas's, ``atlas.folder_for``), beside the engine's."""
    return Path(folder) / f"{grid.model.replace('/', '__')}.wrappers.jsonl"


def _compute(lm, grid: experiment.Grid, work, templates, attacks: dict[str, str], current: dict) -> list[dict]:
    """Rows of a task (``experiment._plan``): one prefill per prompt for its missing settings, then every answer of
    the task in one running batch on the head-masked caches."""
    items = []
    for number, (record, order, missing, ids) in enumerate(work, start=1):
        note(f"prefilling prompt {number} of {len(work)} in this task")
        prompt = prompts.prompt_for(lm.tokenizer, record, templates, order, grid.template)
        cuts, prefill_s = compressed(lm, prompt, list(dict.fromkeys(s for s, _ in missing)))
        timed = SimpleNamespace(seconds=prefill_s)  # what experiment._row reads of a prefill
        items += [(record, order, prompt, timed, s, cuts[s], q, ids[(s, q)]) for s, q in missing]
    pairs = [(item[5], item[2].query_ids(attacks[item[6]])) for item in items]
    with head_masking(lm.model):
        answers = generation.answer_batch(
            lm, pairs, [grid.tokens_for(item[6]) for item in items], batch_size=grid.batch_size
        )
    return [experiment._row(grid, lm, item, current, reply) for item, reply in zip(items, answers)]


def attack(
    grid: experiment.Grid, folder: Path, progress: bool = True, lm: models.LoadedModel | None = None
) -> pd.DataFrame:
    """The attack rows of ``grid`` (an ``atlas.attack_grid`` of ``register``-ed keys): computes what the store lacks
    (``experiment.run``'s plan and resumption: a killed run loses at most the task in progress), returns the grid's
    rows as ``experiment.run`` does."""
    if any(q not in ("attack",) and not q.startswith(data.ATTACK_QUERY) for q in grid.queries):
        raise atlas.AtlasError(f"fairkv.runs.wrappers runs attack queries only; the grid asks for {list(grid.queries)}")
    if lm is not None and lm.model.dtype != getattr(torch, grid.dtype):
        raise atlas.AtlasError(f"the model passed in runs in {lm.model.dtype}, the grid asks for {grid.dtype}")
    current = versions()
    store = ResultsStore(store_path(grid, folder))
    records = data.load_records(grid.dataset)[grid.start : grid.start + grid.n_prompts if grid.n_prompts else None]
    job = experiment.Job(grid, data.load_defense_templates(), grid.attacks(), current)
    checksum = lm.checksum if lm is not None else experiment._checksum(grid.model)
    tasks, total = experiment._plan(grid, records, checksum, store.rows(), current, store)
    done = store.rows()
    if tasks:
        with store.computing():
            done = store.rows()
            tasks, total = experiment._plan(grid, records, checksum, done, current, store)
            lm = lm or executors.shared_model(job, models.default_device())
            missing = sum(len(cells) for task in tasks for _, _, cells, _ in task)
            bar = Bar(total=total, initial=total - missing, desc="rows", unit="row", disable=not progress)
            for task in tasks:
                rows = _compute(lm, grid, task, job.templates, job.attacks, current)
                executors.release_memory()
                done.update({row["cell_id"]: row for row in store.append(rows)})
                bar.update(len(rows))
            bar.close()
    return experiment._collect(grid, records, done, checksum)


__all__ = [
    "HEAD_MASKED",
    "attack",
    "compressed",
    "head_masked_attention",
    "head_masking",
    "kept_indices",
    "kept_mask",
    "press_mask",
    "register",
    "store_path",
    "versions",
]
