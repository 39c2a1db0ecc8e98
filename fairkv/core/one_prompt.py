"""One system prompt through policies and ratios: one prefill scores every policy (``score_once``), each cell is cut from
it, then every cell's benign and attack query are answered together in one running batch
(``generation.answer_batch``, as the experiment engine decodes).

Each cell (policy, ratio) yields one row: the two responses, IFEval accuracy of the benign response, ROUGE-L leakage
of the attack response against every span's reference (directive, defense), keep rate per span, and timings. The
uncompressed cell (r = 0) is computed once and shared by every policy (a ScorerPress at r = 0 keeps everything; a
test checks the responses are identical). ``decode_s`` is the cell's share of the batch's wall time.

Scope: a single prompt; sweeps over many prompts with a results store are the experiment engine's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd
import torch

from fairkv.core import metrics, score_once
from fairkv.core.data import Record
from fairkv.core.generation import Answer, Compressed, answer_batch
from fairkv.core.models import LoadedModel
from fairkv.core.presses import Setting, check_ratio, get_policy, rates
from fairkv.core.progress import Bar
from fairkv.core.prompts import Prompt


@dataclass
class Evaluation:
    """Rows (one per policy x ratio) and the keep map of each cell: (policy, ratio) -> (n_tokens,) keep fractions."""

    prompt: Prompt
    rows: pd.DataFrame
    keep_maps: dict[tuple[str, float], torch.Tensor]
    model: str

    def summary(self, digits: int = 3) -> pd.DataFrame:
        """Keep rates, accuracy and leakage per cell, rounded (no timings: they vary from run to run)."""
        columns = ["policy", "ratio"] + [c for c in self.rows if c.startswith(("keep_", "leak_"))]
        columns += ["refused", "leaked", "prompt_strict", "prompt_loose", "inst_strict", "inst_loose"]
        return self.rows[columns].round(digits)

    def responses(self, ratio: float, width: int = 100) -> pd.DataFrame:
        """Both responses of every policy at one ratio, cut to ``width`` characters."""
        rows = self.rows[self.rows["ratio"] == ratio]
        cut = lambda text: text if len(text) <= width else text[: width - 3] + "..."
        return pd.DataFrame(
            {
                "policy": rows["policy"],
                "benign": rows["benign_response"].map(cut),
                "attack": rows["attack_response"].map(cut),
            }
        ).reset_index(drop=True)


def span_table(prompt: Prompt) -> pd.DataFrame:
    """The prompt's spans (and the whitelist phrase): token range, length, and the first and last characters."""
    rows = [
        {"span": s.name, "start": s.start, "end": s.end, "tokens": len(s), "begins": s.text[:40], "ends": s.text[-40:]}
        for s in prompt.spans
    ]
    if prompt.protected:
        first, last = prompt.protected[0], prompt.protected[-1]
        text = prompt.tokenizer.decode(prompt.ids[0, first : last + 1])
        rows.append(
            {
                "span": "whitelist",
                "start": first,
                "end": last + 1,
                "tokens": len(prompt.protected),
                "begins": text[:40],
                "ends": text[-40:],
            }
        )
    return pd.DataFrame(rows)


def _row(record, prompt, compressed: Compressed, benign: Answer, attacked: Answer) -> dict:
    return {
        "key": record.key,
        "n_prefix": prompt.n_tokens,
        **metrics.benign_scores(record, benign.text),
        **metrics.attack_scores(prompt.references, attacked.text, prompt.raw_references),
        **{
            f"keep_{name}": rate
            for name, rate in rates.keep_rates(compressed.kept, prompt.spans, prompt.n_tokens).items()
        },
        "benign_response": benign.text,
        "attack_response": attacked.text,
        "cut_s": compressed.seconds,
        "decode_s": benign.seconds + attacked.seconds,
        "new_tokens": benign.n_tokens + attacked.n_tokens,
    }


def evaluate_prompt(  # 8 parameters: the library's one-prompt API (docs/library.md), a grid's fields
    lm: LoadedModel,
    record: Record,
    prompt: Prompt,
    attack: str,
    policies: Sequence[str],
    ratios: Sequence[float],
    max_new_tokens: int = 32,
    progress: bool = True,
) -> Evaluation:
    """Every policy at every ratio on one prompt; r = 0 is computed once and shared."""
    ratios = sorted({check_ratio(r) for r in ratios})
    for policy in policies:
        get_policy(policy)
    prefilled = score_once.prefill(lm, prompt, tuple(policies))  # scores every policy once (score once, cut many)
    cells = [(None, 0.0)] if 0.0 in ratios else []  # r = 0: one cell shared by every policy
    cells += [(policy, ratio) for policy in policies for ratio in ratios if ratio > 0]
    bar = Bar(total=len(cells), desc="cells", disable=not progress)
    compressed = {}
    for policy, ratio in cells:
        compressed[(policy, ratio)] = score_once.cut(prefilled, Setting(policy, ratio=ratio))
        bar.update()
    bar.close()
    queries = (prompt.query_ids(record.user), prompt.query_ids(attack))
    answers = iter(answer_batch(lm, [(c, q) for c in compressed.values() for q in queries], max_new_tokens))
    done = {cell: _row(record, prompt, c, next(answers), next(answers)) for cell, c in compressed.items()}
    rows, maps = [], {}
    for policy in policies:
        for ratio in ratios:
            cell = (None, 0.0) if ratio == 0.0 else (policy, ratio)
            rows.append({"policy": policy, "ratio": ratio, **done[cell]})
            maps[(policy, ratio)] = rates.keep_map(compressed[cell].kept, prompt.n_tokens)
    return Evaluation(prompt=prompt, rows=pd.DataFrame(rows), keep_maps=maps, model=lm.name)
