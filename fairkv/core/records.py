"""What every dataset's records share: the ``Record`` a prompt is built from, the JSONL reader, the data error.

``fairkv.core.data`` reads the paper's sys_ifeval records and RaccoonBench attacks, ``fairkv.core.longbench`` LongBench
TREC (Appendix I), ``fairkv.core.multispan`` the N-span prompts; each builds on this module, and ``data.load_records``
dispatches to them by dataset name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


class DataError(ValueError):
    """Reference data is missing or malformed."""


@dataclass(frozen=True)
class Record:
    """One sys_ifeval row: the system directive, the benign user query, and IFEval's checks for the directive."""

    key: int
    system: str
    user: str
    instruction_id_list: tuple[str, ...]
    kwargs: tuple[dict, ...] = field(hash=False)
    prompt: str = ""

    @property
    def n_instructions(self) -> int:
        return len(self.instruction_id_list)


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a malformed line raises DataError naming the file and the line number."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{path}, line {number}: not valid JSON ({error.msg})") from error
            if not isinstance(row, dict):
                raise DataError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows
