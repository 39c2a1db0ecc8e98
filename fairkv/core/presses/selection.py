"""Which positions to keep: the base policy, whitelisting (Section 5.1, Appendix D), fair eviction (Section 5.2,
Algorithm 1, Appendix F) and its lambda debiasing (Appendix G), for any number of spans.

``choose`` is the one selection rule, shared by ``RecordingPress`` (which scores during prefill) and the experiment
engine (which scores once and cuts the same scores at many ratios). It asks for three kinds of scores
(batch, kv_heads, n), computed or looked up by the caller:

- "press": the kvpress press's own score (the base variant is exactly ``ScorerPress.compress``);
- "ranking": the same ranking, with StreamingLLM's ties broken by recency (``Policy.ranking_scores``, ``fairkv.core.presses.policy``);
- "local": Appendix F's span-local scores (``Policy.local_scores``).

Whitelist: the whitelisted positions are always kept (before StreamingLLM's sinks, which it also scores +inf) and the
policy ranks the rest, so the kept count stays exactly ``compute_n_kept``; a whitelist larger than the budget is an error unless ``keep_only_whitelist`` (then only the
whitelist is kept; the paper stops at r = 0.7 for this reason).

Boundary protection (not the paper's; after arXiv 2605.18053, ``boundary_positions``): a share of the budget at each
boundary of the prompt is kept first, like a whitelist, and the policy ranks the rest.

Fair / debiasing, per KV head: the base selection (with the whitelist) decides how many of each span's tokens it
keeps (b_k^default); budgets b_k(lam) = lam * b_k^fair + (1 - lam) * b_k^default are apportioned to integers that sum
to the base budget (``budget.debiased_budgets``); each span keeps its top b_k span-local scores, whitelisted tokens
first and counted inside their span. lam = 1 is fair eviction; lam = 0 returns the base selection unchanged.

Differs from the paper: it defines two spans; this takes any number. For 0 < lam < 1 the budgets blend as Appendix G
says and tokens are ranked by the span-local scores (the paper does not say which scores rank them); only lam = 0
switches back to the base policy's ranking, so that it reproduces the base policy exactly.
Differs from the authors' code: their fair presses ignore the whitelist; here the two compose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from kvpress.utils import compute_n_kept

from fairkv.core.presses.budget import BudgetError, debiased_budgets
from fairkv.core.presses.setting import Setting


class WhitelistError(ValueError):
    """The whitelist cannot be kept within the budget, or names positions outside the prefix."""


class SpanError(ValueError):
    """Spans that do not partition the prefix."""


def check_spans(spans: Sequence[tuple[int, int]], n: int) -> None:
    """Spans must be non-empty, in order, adjacent and disjoint, and cover [0, n)."""
    if not spans:
        raise SpanError("fair eviction needs at least one span")
    for start, end in spans:
        if not start < end:
            raise SpanError(f"empty or reversed span ({start}, {end})")
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise SpanError(f"overlapping spans: one ends at {end}, the next starts at {start}")
        if start > end:
            raise SpanError(f"gap between spans: tokens {end}..{start - 1} belong to no span")
    if spans[0][0] != 0 or spans[-1][1] != n:
        raise SpanError(f"spans cover [{spans[0][0]}, {spans[-1][1]}) but the prefix has {n} tokens")


@dataclass(frozen=True)
class Marks:
    """What a setting's variant reads of the prompt, in token positions of the prefix: ``spans`` (start, end) that
    partition it (fair eviction) and ``protected`` positions (the whitelist)."""

    spans: tuple[tuple[int, int], ...] = ()
    protected: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "spans", tuple((int(s), int(e)) for s, e in self.spans))
        object.__setattr__(self, "protected", tuple(int(p) for p in self.protected))
        if self.spans:
            check_spans(self.spans, self.spans[-1][1])

    def require(self, setting: Setting) -> None:
        """A variant gets what it needs: whitelist variants positions to protect, fair variants the prompt's spans."""
        if setting.variant.whitelist and not self.protected:
            raise WhitelistError("the whitelist variant needs protected positions: the whitelist phrase was not found")
        if (setting.variant.fair or setting.variant.boundary) and not self.spans:
            raise SpanError(f"the {setting.variant} variant needs the prompt's spans")


def boundary_positions(spans: Sequence[tuple[int, int]], n: int, n_kept: int, share: float) -> tuple[int, ...]:
    """Boundary protection's reserve: after "Protection Is (Nearly) All You Need" (arXiv 2605.18053), which keeps 10%
    of a capped cache at each boundary of the prompt. A system prompt's boundaries are where its cache begins, where
    one span (instruction) ends and the next begins, and where the cache ends; each keeps m = floor(share * n_kept)
    tokens: the first m at the start (the chat template's role marker and the first span's first tokens), the last m
    at the end (the end-of-turn marker and the last span's last tokens), and at a junction the earlier span's last
    floor(m / 2) and the later span's first ceil(m / 2) tokens (a shorter span gives all its tokens). A budget that
    leaves a boundary no token, or cannot hold every boundary's, is an error."""
    check_spans(spans, n)
    per_boundary, boundaries = int(share * n_kept + 1e-9), len(spans) + 1
    if per_boundary < 1 or per_boundary * boundaries > n_kept:
        raise BudgetError(
            f"a budget of {n_kept} tokens cannot keep a share of {share:g} at each of the prompt's {boundaries} "
            f"boundaries ({per_boundary} tokens each): use a share between {1 / n_kept:.3g} and {1 / boundaries:.3g}, "
            "or a lower ratio"
        )
    kept = set()
    for k, (start, end) in enumerate(spans):
        head = per_boundary if k == 0 else (per_boundary + 1) // 2
        tail = per_boundary if k == len(spans) - 1 else per_boundary // 2
        kept.update(range(start, min(start + head, end)), range(max(end - tail, start), end))
    return tuple(sorted(kept))


def protected_positions(setting: Setting, marks: Marks, n: int, n_kept: int) -> tuple[int, ...]:
    """The positions ``setting``'s variant keeps before the policy ranks the rest: the whitelist's, boundary
    protection's reserve (``boundary_positions``), or none."""
    if setting.variant.boundary:
        return boundary_positions(marks.spans, n, n_kept, setting.share)
    return marks.protected if setting.variant.whitelist else ()


def choose(
    scores: Callable[[str], torch.Tensor],
    shape: tuple[int, int, int],
    setting: Setting,
    marks: Marks = Marks(),
    keep_only_whitelist: bool = False,
    reserved: Sequence[int] = (),
) -> torch.Tensor:
    """Indices (batch, kv_heads, n_kept) to keep for a prefix of ``shape`` = (batch, kv_heads, n) in ``setting``
    (its variant, lam and ratio).

    ``reserved``: positions the policy always keeps and fair eviction keeps outside its split (StreamingLLM's sinks,
    ``Policy.reserved_positions``); the whitelist comes before them when the budget cannot hold both."""
    batch, heads, n = shape
    variant, ratio = setting.variant, setting.ratio
    n_kept = compute_n_kept(n, ratio)
    if not (variant.fair or variant.whitelist or variant.boundary):
        return topk_select(scores("press"), n_kept)
    whitelist = protected_positions(setting, marks, n, n_kept)
    if check_whitelist(whitelist, n, n_kept, keep_only_whitelist, ratio):
        return torch.tensor(whitelist).expand(batch, heads, len(whitelist))
    base = whitelist_select(scores("ranking"), n_kept, whitelist)
    if not variant.fair or setting.lam == 0.0:
        return base
    check_spans(marks.spans, n)
    reserved = [p for p in reserved if p not in set(whitelist)][: n_kept - len(whitelist)]
    return fair_select(base, scores("local"), n_kept, marks.spans, whitelist, setting.lam, reserved)


def gather_kept(keys: torch.Tensor, values: torch.Tensor, indices: torch.Tensor):
    """Keep ``indices`` (batch, kv_heads, n_kept) of keys and values (batch, kv_heads, n, head_dim), in that order;
    return the kept keys, values and the sorted positions (what is recorded)."""
    gather = indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    return keys.gather(2, gather).contiguous(), values.gather(2, gather).contiguous(), indices.sort(dim=-1).values


def topk_select(scores: torch.Tensor, n_kept: int) -> torch.Tensor:
    """ScorerPress's rule: the n_kept highest scores per head (kvpress's top-k order)."""
    return scores.topk(n_kept, dim=-1).indices


def check_whitelist(protected: Sequence[int], n: int, n_kept: int, keep_only: bool, ratio: float) -> bool:
    """Validate a whitelist; True when it overflows the budget and the caller opted to keep only it."""
    if any(not 0 <= p < n for p in protected) or len(set(protected)) != len(protected):
        raise WhitelistError(f"whitelist positions must be distinct and inside the prefix of {n} tokens")
    if len(protected) > n_kept:
        if not keep_only:
            raise WhitelistError(
                f"whitelist of {len(protected)} tokens exceeds the budget of {n_kept} kept tokens at r = {ratio}; "
                "lower the ratio or whitelist fewer tokens"
            )
        return True
    return False


def whitelist_first(scores: torch.Tensor, protected: Sequence[int]) -> torch.Tensor:
    """Scores that rank the whitelisted positions above every other, even those the policy scores +inf
    (StreamingLLM's sinks): top-k then keeps the whole whitelist whenever the budget holds it."""
    scores = scores.float().clamp(max=torch.finfo(torch.float32).max)
    scores[..., list(protected)] = float("inf")
    return scores


def whitelist_select(scores: torch.Tensor, n_kept: int, protected: Sequence[int]) -> torch.Tensor:
    """Section 5.1: the whitelisted positions first, then the policy's best among the rest, n_kept in all."""
    if not protected:
        return topk_select(scores, n_kept)
    return topk_select(whitelist_first(scores, protected), n_kept)


def fair_select(  # 7 parameters: Algorithm 1's inputs (Sec 5.2)
    base: torch.Tensor,
    local_scores: torch.Tensor,
    n_kept: int,
    spans: Sequence[tuple[int, int]],
    protected: Sequence[int],
    lam: float,
    reserved: Sequence[int] = (),
) -> torch.Tensor:
    """Algorithm 1 / Appendix G per KV head: span budgets blended between the base selection ``base`` and the fair
    split, then the top span-local scores inside each span (whitelisted positions first).

    ``reserved`` positions (StreamingLLM's sinks, Appendix F.3) are kept and the rest of the budget is split in
    proportion to the spans' lengths without them; the local scores must rank them first inside their span."""
    batch, heads, _ = base.shape
    n = spans[-1][1]
    scores = whitelist_first(local_scores, protected)
    lengths = [end - start for start, end in spans]
    count = lambda positions: [sum(start <= p < end for p in positions) for start, end in spans]
    in_reserve = count(reserved)
    lower = [w + r for w, r in zip(count(protected), in_reserve)]
    base_mask = torch.zeros(batch, heads, n, dtype=torch.bool, device=base.device).scatter_(-1, base, True)
    chosen = torch.empty(batch, heads, n_kept, dtype=torch.long, device=base.device)
    for b in range(batch):
        for h in range(heads):
            default = [int(base_mask[b, h, start:end].sum()) for start, end in spans]
            budgets = debiased_budgets(n_kept, lengths, lower, default, lam, in_reserve)
            picks = [scores[b, h, s:e].topk(k).indices + s for (s, e), k in zip(spans, budgets) if k > 0]
            chosen[b, h] = torch.cat(picks)
    return chosen
