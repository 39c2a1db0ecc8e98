"""Beyond the paper: eviction bias across every kvpress press (notebook 12, the press atlas).

The paper measures five policies (Section 4). kvpress exports many more presses; ``CATALOG`` names every one of them
(a test keeps it complete when kvpress adds a press) with how the atlas runs it, or why it cannot run here: weights
or statistics from the Hugging Face hub, compression while decoding rather than of the prefill, a prefill of its own,
or no eviction of tokens at all. Wrappers (AdaKV, CriticalKV, PyramidKV's layer budgets, Chunk, ChunkKV, Block) wrap
SnapKV with the paper's settings (``presses.registry``), so their rows read as "what the wrapper changes in SnapKV".

Keep rates come from one prefill per prompt (``keep_rates``): kvpress compresses a layer's cache in a hook after that
layer's attention, so the hook's inputs never depend on the press (``fairkv.core.score_once``), and the collector calls every
press's own ``compress`` at every ratio on them. Which positions a press kept is read from what it returns (the kept
keys are gathered copies of prefix keys: ``kept_mask`` finds them) or, for AdaKV-style presses that keep the cache
and mask instead, from the indices it masks. No press is re-implemented: kvpress decides every kept set.

What the rows say (each press's bias and pattern, the attack side's claims) is ``fairkv.report.press_patterns``'s.

Rows live in their own store (``store_path``) and carry ``versions`` with the atlas's own fingerprint
(``fingerprint.ATLAS``, beside the sweep's): an edit of the code they run never mixes with older atlas rows.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import kvpress
import pandas as pd
import torch
from kvpress import BasePress, ScorerPress
from kvpress.utils import compute_n_kept

from fairkv.core import data, models, prompts
from fairkv.core.presses import make_press
from fairkv.core.presses.registry import SNAPKV_WINDOW
from fairkv.core.presses.selection import topk_select
from fairkv.core.progress import Bar, note
from fairkv.runs import experiment, fingerprint
from fairkv.runs.store import ResultsStore
from fairkv.runs.studies import TEN_RATIOS, results_folder

ATLAS_RATIOS = TEN_RATIOS[1:]  # r = 0.1 ... 0.9; r = 0 keeps everything for every press
SPANS = ("defense", "directive")
SEED = 0  # presses that draw random numbers (Random, LeverageScore's sketch) draw them seeded by SEED + the layer


class AtlasError(ValueError):
    """A press the atlas cannot run as asked, or a kept set it cannot read."""


@dataclass(frozen=True)
class Entry:
    """How the atlas runs one kvpress press, or why it does not (``build`` None, ``reason`` given).

    ``scoring`` says whether the press's score of a token reads other tokens ("cross-token": queries, keys or values
    of other positions), only the token itself ("independent"), or is a wrapper's ("wrapper of <inner>").
    ``attentions``: the press reads the prefill's attention weights (the collector passes them; kvpress's chunked
    wrappers refuse them, SnapKV computes its window's own when they are absent)."""

    name: str
    label: str = ""
    build: Callable[[float], BasePress] | None = None
    scoring: str = ""
    reason: str = ""
    attentions: bool = False
    paper: bool = False
    ratio_free: bool = False  # a ScorerPress whose score does not read the ratio: scored once, cut at every ratio


def _snapkv(ratio: float = 0.0) -> ScorerPress:
    return make_press("snapkv", ratio)


def _paper(name: str, key: str, label: str, scoring: str, ratio_free: bool = True) -> Entry:
    return Entry(name, label, lambda r: make_press(key, r), scoring, attentions=True, paper=True, ratio_free=ratio_free)


def _scorer(name: str, label: str, build: Callable[[float], ScorerPress], scoring: str, ratio_free: bool = True):
    return Entry(name, label, build, scoring, ratio_free=ratio_free)


def _wrapper(name: str, label: str, build: Callable[[float], BasePress]) -> Entry:
    return Entry(name, label, build, "wrapper of SnapKV")  # CriticalKV's two stages read the ratio: never ratio-free


HUB = "needs weights or statistics from the Hugging Face hub (offline here)"
DECODING = "compresses while decoding, not the prefill the paper's pitfall is about"
CATALOG: dict[str, Entry] = {
    e.name: e
    for e in (
        # the paper's five, with the paper's settings (fairkv.core.presses.registry)
        _paper("StreamingLLMPress", "streamingllm", "StreamingLLM", "independent", ratio_free=False),
        _paper("ObservedAttentionPress", "h2o", "H2O", "cross-token"),
        _paper("SnapKVPress", "snapkv", "SnapKV", "cross-token"),
        _paper("TOVAPress", "tova", "TOVA", "cross-token"),
        _paper("KnormPress", "knorm", "K-Norm", "independent"),
        # other scorers, kvpress's defaults (Compactor blends its two scores by the ratio)
        _scorer(
            "ExpectedAttentionPress", "ExpectedAttention", lambda r: kvpress.ExpectedAttentionPress(r), "cross-token"
        ),
        _scorer("KeyDiffPress", "KeyDiff", lambda r: kvpress.KeyDiffPress(r), "cross-token"),
        _scorer("LagKVPress", "LagKV", lambda r: kvpress.LagKVPress(r), "cross-token"),
        _scorer("CURPress", "CUR", lambda r: kvpress.CURPress(r), "cross-token"),
        _scorer("LeverageScorePress", "LeverageScore", lambda r: kvpress.LeverageScorePress(r), "cross-token"),
        _scorer("CompactorPress", "Compactor", lambda r: kvpress.CompactorPress(r), "cross-token", ratio_free=False),
        _scorer("CapPress", "CAP", lambda r: kvpress.CapPress(r), "cross-token"),
        _scorer("NonCausalAttnPress", "NonCausalAttn", lambda r: kvpress.NonCausalAttnPress(r), "cross-token"),
        _scorer("RandomPress", "Random", lambda r: kvpress.RandomPress(r), "independent"),
        # wrappers, around SnapKV with the paper's settings
        _wrapper("AdaKVPress", "AdaKV(SnapKV)", lambda r: kvpress.AdaKVPress(_snapkv(r))),
        _wrapper("CriticalKVPress", "CriticalKV(SnapKV)", lambda r: kvpress.CriticalKVPress(_snapkv(r))),
        _wrapper("CriticalAdaKVPress", "CriticalAdaKV(SnapKV)", lambda r: kvpress.CriticalAdaKVPress(_snapkv(r))),
        _wrapper(
            "PyramidKVPress", "PyramidKV", lambda r: kvpress.PyramidKVPress(r, window_size=SNAPKV_WINDOW, kernel_size=5)
        ),
        _wrapper("ChunkKVPress", "ChunkKV(SnapKV)", lambda r: kvpress.ChunkKVPress(_snapkv(r))),
        _wrapper(
            "EntropyGatedChunkKVPress",
            "EntropyGatedChunkKV(SnapKV)",
            lambda r: kvpress.EntropyGatedChunkKVPress(_snapkv(r)),
        ),
        # kvpress's default chunk (1024 tokens) is longer than every prompt here, where ChunkPress is SnapKV itself
        _wrapper("ChunkPress", "Chunk64(SnapKV)", lambda r: kvpress.ChunkPress(_snapkv(r), chunk_length=64)),
        _wrapper("BlockPress", "Block64(SnapKV)", lambda r: kvpress.BlockPress(_snapkv(r), block_size=64)),
        # not in the atlas, with the reason
        Entry(
            "KeyRerotationPress",
            reason="keeps exactly its inner press's tokens and re-rotates their keys: its kept set "
            "is the inner press's row",
        ),
        Entry(
            "MergingPress",
            reason="keeps exactly its inner press's tokens and folds the evicted values into them: its "
            "kept set is the inner press's row",
        ),
        Entry(
            "PerLayerCompressionPress",
            reason="sets a ratio per layer for an inner press: at one ratio for all layers "
            "it is the inner press (PyramidKV is the atlas's per-layer budget)",
        ),
        Entry("ComposedPress", reason="chains presses one after another: each is measured on its own"),
        Entry(
            "SimLayerKVPress",
            reason="has no compression ratio: lazy layers keep the first 4 and the last 1024 tokens, "
            "which is every token of a prompt here",
        ),
        Entry("ThinKPress", reason="prunes key channels, not tokens: no token is evicted"),
        Entry(
            "FinchPress",
            reason="needs a question after a delimiter token in the prefill; the paper's prefill is the "
            "system prompt alone",
        ),
        Entry(
            "KVzipPress",
            reason="scores by re-reading the context in extra forward passes (not the one prefill the "
            "atlas scores), with a chunked prefill of its own",
        ),
        Entry("KVgradPress", reason="a KVzip variant: extra forward and backward passes over the context"),
        Entry("RestoreKVPress", reason="a KVzip variant: extra forward passes over the context"),
        Entry("FastKVzipPress", reason=f"{HUB} (trained gates), and a CUDA kernel"),
        Entry("KVzapPress", reason=f"{HUB} (a trained scorer)"),
        Entry("DMSPress", reason=f"{HUB} (a model trained for dynamic memory sparsification)"),
        Entry("DuoAttentionPress", reason=f"{HUB} (attention patterns per head)"),
        Entry("QFilterPress", reason=f"{HUB} (learned query filters)"),
        Entry("ExpectedAttentionStatsPress", reason=f"{HUB} (query statistics per model)"),
        Entry(
            "LUKVPress",
            reason="allocates budgets from a pre-computed curve per model, which kvpress ships for other "
            "models than the embedded ones",
        ),
        Entry(
            "KVComposePress",
            reason="aligns one composite token set across heads (structured), so its kept count is "
            "not the ratio's per head; not measured yet",
        ),
        Entry("DecodingPress", reason=DECODING),
        Entry("CAMPress", reason=DECODING),
        Entry("CompressionRatioDecodingPress", reason=DECODING),
        Entry(
            "PrefillDecodingPress",
            reason="pairs a prefill press with a decoding press: its prefill part is a press of the atlas",
        ),
        Entry("BasePress", reason="abstract base class"),
        Entry("ScorerPress", reason="abstract base class"),
    )
}


def kvpress_presses() -> list[str]:
    """Every press kvpress exports (the names the catalog must cover)."""
    return sorted(name for name in dir(kvpress) if name.endswith("Press") and isinstance(getattr(kvpress, name), type))


def runnable(names=None) -> list[Entry]:
    """The catalog entries the atlas runs (``names``: kvpress class names or labels; default every runnable one);
    a name the catalog lacks or cannot run is an error giving the reason."""
    if names is None:
        return [e for e in CATALOG.values() if e.build is not None]
    by_label = {e.label: e for e in CATALOG.values() if e.label}
    chosen = []
    for name in names:
        entry = CATALOG.get(name) or by_label.get(name)
        if entry is None:
            raise AtlasError(f"unknown press {name!r}: the catalog names kvpress classes ({', '.join(CATALOG)})")
        if entry.build is None:
            raise AtlasError(f"{name} is not in the atlas: {entry.reason}")
        chosen.append(entry)
    return chosen


def skipped() -> pd.DataFrame:
    """The presses the atlas does not run, with the reason (listed in the notebook, never skipped silently)."""
    return pd.DataFrame([(e.name, e.reason) for e in CATALOG.values() if e.build is None], columns=["press", "why not"])


def kept_mask(keys: torch.Tensor, kept_keys: torch.Tensor, masked=None) -> torch.Tensor:
    """(batch, kv_heads, n) True where a position was kept: ``kept_keys`` (batch, kv_heads, k, d) are gathered copies
    of ``keys`` (batch, kv_heads, n, d), found by an exact match; ``masked`` (batch, head, position index tensors,
    kvpress's ``masked_key_indices``) marks evicted positions of a press that keeps the cache's shape."""
    batch, heads, n, dim = keys.shape
    if masked is not None:
        mask = torch.ones(batch, heads, n, dtype=torch.bool)
        mask[masked[0].cpu(), masked[1].cpu(), masked[2].cpu()] = False
        return mask
    if kept_keys.shape[2] == n:
        return torch.ones(batch, heads, n, dtype=torch.bool)
    signature = lambda k: _bits(k) @ _multipliers(dim)  # exact integer arithmetic: equal keys, equal signatures
    keys_signature = signature(keys)  # (batch, heads, n)
    order = keys_signature.argsort(-1)
    ordered = keys_signature.gather(-1, order)
    found = torch.searchsorted(ordered, signature(kept_keys)).clamp(max=n - 1)
    positions = order.gather(-1, found)
    exact = keys.cpu().gather(2, positions.unsqueeze(-1).expand(-1, -1, -1, dim)).equal(kept_keys.cpu())
    if not exact or (ordered[..., 1:] == ordered[..., :-1]).any():
        raise AtlasError(
            "the press returned keys that are not copies of distinct prefix keys: its kept set cannot be read"
        )
    return torch.zeros(batch, heads, n, dtype=torch.bool).scatter_(-1, positions, True)


def _bits(keys: torch.Tensor) -> torch.Tensor:
    """The keys' raw bits as int64 (float32 and bfloat16 alike)."""
    integer = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[keys.dtype]
    return keys.detach().cpu().contiguous().view(integer).long()


def _multipliers(dim: int) -> torch.Tensor:
    return torch.randint(1, 2**62, (dim,), generator=torch.Generator().manual_seed(SEED), dtype=torch.int64)


@contextmanager
def _masking_allowed(module):
    """AdaKV-style presses refuse eager attention because their decoding-time masking patch does not cover it; the
    atlas only reads which keys they mask, so the check is lifted for the call, and the mask cleared after it."""
    config = module.config
    implementation = config._attn_implementation
    config._attn_implementation = "sdpa"
    try:
        yield
    finally:
        config._attn_implementation = implementation
        module.masked_key_indices = None


def press_mask(press: BasePress, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
    """Positions (batch, kv_heads, n) that ``press`` keeps in this layer, from its own ``compress``."""
    torch.manual_seed(SEED + module.layer_idx)
    with _masking_allowed(module):
        kept_keys, _ = press.compress(module, hidden_states, keys, values, attentions, kwargs)
        masked = getattr(module, "masked_key_indices", None)
        return kept_mask(keys, kept_keys, masked)


def span_rates(masks: list[torch.Tensor], spans) -> dict[str, float]:
    """Keep rate per span from per-layer masks: ``metrics.keep_rates``'s definition (per layer the mean over KV heads
    of |kept ∩ span| / |span|, then the mean over layers), for kept sets of any size per head."""
    rates = torch.stack([torch.stack([m[..., s.start : s.end].float().mean(-1).mean() for s in spans]) for m in masks])
    return {span.name: float(rate) for span, rate in zip(spans, rates.mean(0))}


# what a kvpress press raises when it cannot compress a prompt (SnapKV inside a chunk shorter than its window, ...)
PRESS_FAILURES = (AssertionError, ValueError, RuntimeError, IndexError)


class _Collector(BasePress):
    """Calls every press's ``compress`` at every ratio on each layer's uncompressed prefill (a ratio-free scorer's
    ``score`` once, cut at every ratio by ``ScorerPress``'s top-k); compresses nothing. A press that raises on this
    prompt (``PRESS_FAILURES``) is recorded with its error, and the other presses go on."""

    def __init__(self, entries: list[Entry], ratios: tuple[float, ...]):
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
def keep_rates(lm: models.LoadedModel, prompt: prompts.Prompt, entries: list[Entry], ratios) -> dict:
    """{(label, ratio): ({span: keep rate}, error)} for every entry and ratio, from one prefill of ``prompt``; a press
    that raised on this prompt has NaN keep rates and the error it raised (None for the others)."""
    config = lm.model.config
    if not hasattr(config, "head_dim"):  # CriticalKV reads config.head_dim, which Qwen2's config derives, not stores
        config.head_dim = config.hidden_size // config.num_attention_heads
    collector = _Collector(entries, tuple(ratios))
    with collector(lm.model):
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
        return experiment.profile(self.profile)

    def entries(self) -> list[Entry]:
        return runnable(self.presses)


# the atlas's scale per profile (keep rates need no decoding: the cpu profile runs the paper's 100 prompts)
PLANS: dict[str, Plan] = {
    "ci": Plan("ci", n_prompts=2, ratios=(0.3, 0.5)),
    "cpu": Plan("cpu", n_prompts=100, ratios=ATLAS_RATIOS),
}


def plan(profile: str = "ci", **overrides) -> Plan:
    """The atlas's plan at ``profile`` scale with the notebook's overrides (None values keep the profile's)."""
    if profile not in PLANS:
        raise AtlasError(f"no atlas plan for profile {profile!r}: use one of {', '.join(PLANS)}")
    explicit = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(PLANS[profile], **explicit)


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
    """The result code's versions with the atlas's own fingerprint beside them (the result code's own fingerprint,
    whether or not this process registered presses with ``fairkv.runs.anypress``)."""
    return {
        **fingerprint.versions(),
        "code": fingerprint.of(fingerprint.SWEEP),
        "atlas": fingerprint.of(fingerprint.ATLAS),
    }


def folder_for(profile: str) -> Path:
    """The atlas's results folder: ``<results>/<profile>/atlas/`` (keep rates, and the attack rows of registered
    presses, which carry the extended fingerprint and so never share a store with the paper's rows)."""
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
        "ratio": ratio,
    }


def run(
    plan: Plan, folder: Path | None = None, progress: bool = True, lm: models.LoadedModel | None = None
) -> pd.DataFrame:
    """Keep rates of ``plan`` (one row per prompt, order, press and ratio): computes what its store lacks, one prefill
    per (prompt, order), appending each prompt's rows as they land; rows of other code or versions are an error."""
    grid, entries, current = plan.grid, plan.entries(), versions()
    store = ResultsStore(store_path(plan, folder))
    records = data.load_records(grid.dataset)[: plan.n_prompts]
    templates = data.load_defense_templates()
    cells = [
        (record, order, e.label, r) for record in records for order in plan.orders for e in entries for r in plan.ratios
    ]
    ids = {cell: experiment.cell_id(_identity(plan, *cell)) for cell in cells}
    done = store.rows()
    for cid in set(ids.values()) & set(done):
        if done[cid]["versions"] != current:
            raise AtlasError(
                f"{store.path} holds rows computed by other code or versions ({done[cid]['versions']}, "
                f"now {current}): move it away to recompute, rows are never mixed"
            )
    missing = [cell for cell in cells if ids[cell] not in done]
    if missing:
        with store.computing():
            done = store.rows()
            missing = [cell for cell in cells if ids[cell] not in done]
            lm = lm or models.load_model(grid.model, dtype=getattr(torch, grid.dtype))
            bar = Bar(
                total=len(cells), initial=len(cells) - len(missing), desc="atlas rows", unit="row", disable=not progress
            )
            for record, order in dict.fromkeys((record, order) for record, order, _, _ in missing):
                note(f"prefilling prompt {record.key} ({order}) for {len(entries)} presses x {len(plan.ratios)} ratios")
                prompt = prompts.paper_prompt(lm.tokenizer, record, templates, order)
                start = time.perf_counter()
                rates = keep_rates(lm, prompt, entries, plan.ratios)
                seconds = time.perf_counter() - start
                rows = [
                    {
                        "cell_id": ids[(record, order, label, ratio)],
                        **_identity(plan, record, order, label, ratio),
                        "keep": rates[(label, ratio)][0],
                        "error": rates[(label, ratio)][1],
                        "n_tokens": prompt.n_tokens,
                        "prompt_s": seconds,
                        "versions": current,
                    }
                    for (label, ratio) in rates
                    if ids[(record, order, label, ratio)] not in done
                ]
                done.update({row["cell_id"]: row for row in store.append(rows)})
                bar.update(len(rows))
            bar.close()
    frame = pd.DataFrame([done[ids[cell]] for cell in cells])
    for span in SPANS:
        frame[f"keep_{span}"] = frame["keep"].map(lambda keep, span=span: keep[span])
    scoring = {e.label: e.scoring for e in entries}
    return frame.assign(
        scoring=frame["press"].map(scoring), paper=frame["press"].isin([e.label for e in entries if e.paper])
    )


# The attack side of the most biased presses the engine can take with whitelist and fair eviction
# (``fairkv.runs.anypress``), at the paper's ratios for Figs 8-9, normal order (the paper's prompt)
ATTACK_RATIOS = (0.0, 0.3, 0.5, 0.7)
ATTACK_SCALE = {"ci": dict(n_prompts=2, ratios=(0.0, 0.5)), "cpu": dict(n_prompts=100, ratios=ATTACK_RATIOS)}


def attack_grid(profile: str, policies: list[str], **overrides) -> experiment.Grid:
    """The attack study of registered ``policies`` (keys of ``anypress.register``): base, whitelist and fair, the
    paper's attack, normal order, at the profile's attack scale (``ATTACK_SCALE``; None overrides keep it)."""
    if profile not in ATTACK_SCALE:
        raise AtlasError(f"no atlas attack scale for profile {profile!r}: use one of {', '.join(ATTACK_SCALE)}")
    explicit = {k: v for k, v in overrides.items() if v is not None}
    return experiment.profile(
        profile,
        **{
            "policies": tuple(policies),
            "variants": ("base", "whitelist", "fair"),
            "queries": ("attack",),
            "orders": ("normal",),
            **ATTACK_SCALE[profile],
            **explicit,
        },
    )


__all__ = [
    "ATLAS_RATIOS",
    "ATTACK_RATIOS",
    "CATALOG",
    "PLANS",
    "AtlasError",
    "Entry",
    "Plan",
    "attack_grid",
    "describe",
    "keep_rates",
    "kept_mask",
    "kvpress_presses",
    "plan",
    "run",
    "runnable",
    "skipped",
]
