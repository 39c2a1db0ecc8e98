"""How often two native decodes of the same cells agree: the floor ``fairkv verify`` holds another arithmetic to.

The committed redecoded stores (``results/cpu/redecoded/``, ``fairkv.runs.redecode``) hold cells of the cpu sweep decoded
again on the native path (AVX512-BF16) under another batch plan. Each is paired with the committed row of the same cell
id, and per query kind (the attack queries, the benign one) this counts the pairs whose answers are identical and those
whose *reading* is (``fairkv.report.outcomes.reading``: an attack answer's outcome, a benign answer's IFEval checks). A row
computed with other arithmetic parts from the committed one for the same reason (other sums in another order): a
sample whose agreement is shown to be lower than this is a defect (``fairkv.runs.verify.AGREEMENT``).

    .venv/bin/python benchmarks/decode_agreement.py > benchmarks/results/decode_agreement.txt
"""

from __future__ import annotations

from fairkv.core.paths import REDECODED_FOLDER, results_dir
from fairkv.report.outcomes import reading
from fairkv.runs.store import ResultsStore
from fairkv.runs.verify import query_kind

STORE = "qwen2.5-coder-1.5b.jsonl"


def main() -> None:
    folder = results_dir() / "cpu"
    stored = ResultsStore(folder / STORE).rows()
    again = ResultsStore(folder / REDECODED_FOLDER / STORE).rows()
    pairs = [(stored[cell], row) for cell, row in again.items() if cell in stored and "response" in row]
    print(f"{len(pairs)} cells of {folder / STORE} decoded again on the native path ({folder / REDECODED_FOLDER})")
    for kind in ("attack", "benign"):
        mine = [(a, b) for a, b in pairs if query_kind(a) == kind]
        same = sum(a["response"] == b["response"] for a, b in mine)
        read = sum(reading(a) == reading(b) for a, b in mine)
        print(
            f"{kind}: {len(mine)} pairs; identical answers {same} ({same / len(mine):.3f}); "
            f"identical readings {read} ({read / len(mine):.3f})"
        )


if __name__ == "__main__":
    main()
