"""Whitelisting (Section 5.1, Appendix D): a must-keep set of positions inside the base policy's budget.

The whitelisted positions are always kept; the base policy ranks the rest and fills the remaining b - |S_req| slots,
so the kept count stays exactly the base policy's (``compute_n_kept``). A whitelist larger than the budget cannot be
honoured (the paper stops at r = 0.7 for this reason): that is an error, unless ``keep_only_whitelist`` asks to keep
the whitelist and nothing else (then more than b entries are kept).

Differs from the authors' code: none in mechanism; StreamingLLM ranks by recency (see ``scoring.ranking_scores``) so
the shrunken window is the most recent tokens rather than an arbitrary tie-break.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress.utils import compute_n_kept

from fairkv.presses.recording import RecordingPress
from fairkv.presses.scoring import ranking_scores


class WhitelistError(ValueError):
    """The whitelist cannot be kept within the budget, or names positions outside the prefix."""


@dataclass
class WhitelistPress(RecordingPress):
    """Keep ``protected`` positions, let the wrapped policy choose the rest of its budget."""

    protected: tuple[int, ...] = ()
    keep_only_whitelist: bool = False

    def _protected(self, n: int, n_kept: int) -> torch.Tensor | None:
        """The whitelist as a tensor; None when it overflows the budget and the caller opted to keep only it."""
        if any(not 0 <= p < n for p in self.protected) or len(set(self.protected)) != len(self.protected):
            raise WhitelistError(f"whitelist positions must be distinct and inside the prefix of {n} tokens")
        if len(self.protected) > n_kept:
            if not self.keep_only_whitelist:
                raise WhitelistError(
                    f"whitelist of {len(self.protected)} tokens exceeds the budget of {n_kept} kept tokens at "
                    f"r = {self.compression_ratio}; lower the ratio or pass keep_only_whitelist=True"
                )
            return None
        return torch.tensor(self.protected, dtype=torch.long)

    def select(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        batch, heads, n, _ = keys.shape
        n_kept = compute_n_kept(n, self.compression_ratio)
        protected = self._protected(n, n_kept)
        if protected is None:
            return torch.tensor(self.protected, device=keys.device).expand(batch, heads, len(self.protected))
        scores = ranking_scores(self.press, module, hidden_states, keys, values, attentions, kwargs).clone()
        scores[..., protected.to(keys.device)] = float("inf")
        return scores.topk(n_kept, dim=-1).indices
