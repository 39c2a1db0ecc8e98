"""The one runner: computes what a results store lacks for a job, resumable at any point, and returns the store's rows.

Every kind of row goes through ``run``: the sweeps of the paper's studies and of any press of the catalogue
(``experiment.Job``), the press atlas's keep rates (``atlas.Job``) and the judge's scores (``judge.Job``). A job says
which cells it wants (``cells``: cell key -> cell id), how missing cells group into tasks (``tasks``), how a task is
computed on a loaded model (``compute``) and which model that is (``load``, ``model_key``), and the versions its rows
carry (``versions``: their code's fingerprint and libraries). ``run`` owns the store rule:

- rows of this job stored under other versions or code are an error naming them, never mixed in;
- when cells are missing, the store's compute lock is held (``ResultsStore.computing``): a second process on the same
  store waits and reuses the first one's rows (``wait=False``: fails at once naming it);
- tasks run on an executor (``fairkv.runs.executors``: this process, in one pass over them all, or a Ray cluster, a
  task per worker at a time), and only this process appends their rows as they arrive (a job yields them as they
  land: a sweep prompt by prompt, a Ray worker a task at a time), so a killed run loses at most the rows in flight
  and recomputes nothing stored; the progress bar counts rows done / total with an ETA;
- in a frozen run (``FAIRKV_FROZEN=1``, ``fairkv reproduce --frozen``) a missing cell is an error naming the store, the
  cell and the fix, before anything is loaded or computed.
"""

from __future__ import annotations

from typing import Iterator, Protocol

from fairkv.core.paths import refuse_if_frozen
from fairkv.core.progress import Bar
from fairkv.runs import executors, fingerprint
from fairkv.runs.store import ResultsStore, StoreError


class Job(Protocol):
    versions: dict

    def cells(self) -> dict: ...

    def tasks(self, missing: list) -> list: ...

    def compute(self, lm, tasks: list) -> Iterator[list[dict]]: ...

    def load(self, device: str | None): ...

    def model_key(self) -> tuple: ...


# what a frozen run says of a job's missing cells, unless the job says more (its ``remedy``: the atlas's)
RECOMPUTE = (
    "Run without --frozen (FAIRKV_FROZEN=0) to compute them, or restore the committed rows (git checkout results/)."
)


def run(  # 7 parameters: the job, its store and the options every kind of row shares
    job: Job,
    store: ResultsStore,
    executor="serial",
    lm=None,
    progress: bool = True,
    wait: bool = True,
    desc: str = "rows",
) -> dict[str, dict]:
    """The stored rows of every cell of ``job`` (cell id -> row), computing the missing ones first."""
    ids = job.cells()
    done = store.rows()
    missing = _missing(job, ids, done, store)
    if missing:
        absent = sorted(set(missing.values()))
        refuse_if_frozen(
            f"{store.path} lacks {len(absent)} of the {len(set(ids.values()))} cells this job reads (missing: "
            f"{', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''})",
            job.remedy(list(missing)) if hasattr(job, "remedy") else RECOMPUTE,
        )
        with store.computing(wait):
            done = store.rows()  # rows another process stored while this one waited are reused
            missing = _missing(job, ids, done, store)
            wanted = set(ids.values())
            initial = len(wanted) - len(set(missing.values()))
            bar = Bar(total=len(wanted), initial=initial, desc=desc, unit="row", disable=not progress)
            tasks = job.tasks(list(missing)) if missing else []
            for rows in executors.executor(executor, lm).map(job, tasks):
                rows = [row for row in rows if row["cell_id"] not in done]  # a task retried after its rows landed
                for row in rows:  # a worker of other code, or of another press than this process's, is refused
                    check_versions(row, fingerprint.expected(job.versions, row), store)
                done.update({row["cell_id"]: row for row in store.append(rows)})
                bar.update(len(rows))
            bar.close()
    return done


def _missing(job: Job, ids: dict, done: dict, store: ResultsStore) -> dict:
    """The cells of ``ids`` that ``done`` lacks; a stored one of other versions is an error."""
    for cid in set(ids.values()) & done.keys():
        check_versions(done[cid], fingerprint.expected(job.versions, done[cid]), store)
    return {key: cid for key, cid in ids.items() if cid not in done}


def check_versions(row: dict, current: dict, store: ResultsStore) -> None:
    """A stored row computed under other library versions or code is reported, never mixed into this run's results."""
    if row.get("versions") != current:
        stored = row.get("versions") or {}
        changed = ", ".join(
            f"{name} {stored.get(name)} (now {current.get(name)})"
            for name in sorted(set(stored) | set(current))
            if stored.get(name) != current.get(name)
        )
        raise StoreError(
            f"{store.path} holds cell {row['cell_id']} of this job computed with {changed}; results of different "
            "versions or code (the fingerprint 'code', fairkv.runs.fingerprint) are not mixed: use another results "
            "folder (FAIRKV_RESULTS_DIR), or move this file away to recompute its rows with this code "
            "(or `fairkv restamp` them once this code recomputes them identically)"
        )
