"""Every committed results store matches the code that reads it (issue 49): the rows of each store under ``results/``
carry the versions this checkout stamps on their kind of row (the sweep's, the atlas's keep rates', the judge's:
fingerprint, the stamp of the press each row ran, and libraries), so that a fresh clone's ``make reproduce`` renders them instead of stopping at a stale
row. An edit of code that rows run through fails here, naming each store and the command that verifies and
restamps it."""

from __future__ import annotations

from collections import Counter

from fairkv.core.paths import REPO_ROOT
from fairkv.runs import verify
from fairkv.runs.store import ResultsStore

COMMITTED = REPO_ROOT / "results"


def committed_stores() -> list[ResultsStore]:
    """The stores whose sealed segments are committed (``<store>.part-NNNN.jsonl.gz``), each once."""
    names = {segment.with_name(segment.name.split(".part-")[0] + ".jsonl") for segment in COMMITTED.rglob("*.part-*")}
    return [ResultsStore(path) for path in sorted(names)]


def stale(store: ResultsStore) -> str | None:
    """What is stale in ``store``, with the fix; None when every row carries this checkout's versions."""
    rows = list(store.rows().values())
    kind = verify.kind_of(store.path, rows)
    now = kind.versions()
    # rows of other code, or of another press stamp (issue 69), by the code stamp ``fairkv restamp --was`` takes
    code = Counter(verify.stamp(row["versions"]) for row in rows if not verify.current(row, now))
    libraries = sorted(
        {name for row in rows for name in now if name not in verify.STAMPS and row["versions"].get(name) != now[name]}
    )
    where = f"{store.path.relative_to(REPO_ROOT)} ({kind.name})"
    if code:
        stamps = ", ".join(f"{n} rows of code {stamp} without this checkout's stamps" for stamp, n in code.items())
        return (
            f"{where}: {stamps}, this checkout's code is {verify.stamp(now)}; verify and restamp: "
            f"`fairkv restamp {store.path.relative_to(REPO_ROOT)} --was {next(iter(code))}`"
        )
    if libraries:
        return f"{where}: rows computed with other versions of {', '.join(libraries)}: compute them again with these"
    return None


def test_every_committed_store_carries_this_codes_versions():
    stores = committed_stores()
    assert {store.path.name for store in stores} >= {
        "qwen2.5-coder-1.5b.jsonl",
        "qwen2.5-coder-1.5b.keep-rates.jsonl",
        "judge__qwen2.5-coder-1.5b.jsonl",
    }
    problems = [problem for store in stores if (problem := stale(store))]
    assert not problems, "committed rows of other code:\n" + "\n".join(problems)
