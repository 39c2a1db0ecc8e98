"""Where a sweep's tasks run: in this process (``Serial``) or spread over a Ray cluster (``RayExecutor``).

Both take the same tasks from ``runner.run`` (for a grid, a task is a group of prompts with all their missing settings
and queries, so a prompt's one prefill serves all of them) and yield each task's rows; the driver alone appends them to
the results store, so the store's guarantees hold whatever the executor: no duplicate (the driver drops rows already
stored), nothing lost (a task's rows land whole once it returns; a task whose worker dies is retried on the restarted
worker; a killed driver loses only tasks in flight, and a rerun computes only those).

Ray (PyPI ``ray``, pinned in the ``scale`` extra): each worker is an actor that loads the model once and keeps it for
every task it is given; a worker declares its CPU and GPU needs as Ray resources; ``address`` joins a running cluster
("auto", "ray://head:10001", or ``RAY_ADDRESS``), otherwise Ray starts a local one on this machine. Tasks are handed
out one at a time to whichever worker is free, so a slow task never holds the others back.

Memory in this process (``Serial``): every serial run of a process shares one loaded model (``shared_model``), and
the memory a finished task freed goes back to the operating system (``release_memory``). Without them a notebook
kernel that runs study after study (notebook 11 at the cpu profile: 4 span counts, the attacks, 3 defense templates,
each ``experiment.run`` loading its model) stacks each task's peak on what earlier tasks and model loads freed: glibc
keeps freed heap pages for reuse until ``malloc_trim`` returns them (docs/benchmarks.md lists what measured the peaks).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from typing import Iterator

from fairkv.core import arithmetic, models
from fairkv.runs import fingerprint

KINDS = ("serial", "ray")
_SHARED: dict[tuple, models.LoadedModel] = {}  # the one model this process's serial runs share, by what loads it
_LIBC = ctypes.util.find_library("c")
_MALLOC_TRIM = getattr(ctypes.CDLL(_LIBC), "malloc_trim", None) if _LIBC else None  # glibc's; absent on macOS


class ExecutorError(RuntimeError):
    """An executor that cannot be built or a cluster that cannot finish the work."""


@dataclass
class Serial:
    """Tasks one after another in this process, on ``lm`` or a model loaded at the first task (on the GPU if torch
    sees one)."""

    lm: models.LoadedModel | None = None

    def map(self, job, tasks: list) -> Iterator[list[dict]]:
        if not tasks:
            return
        if self.lm is None:
            self.lm = shared_model(job, models.default_device())
        # one pass over every task (a sweep's decode batch stays full), each row stamped with its arithmetic
        for rows in arithmetic.computed(self.lm, job.compute(self.lm, tasks)):
            release_memory()
            yield rows


def shared_model(job, device: str | None) -> models.LoadedModel:
    """The job's model as this process loaded it for an earlier run (same model, int8 and dtype on ``device``), or
    loaded now in place of the one held before: one model per process, however many studies a notebook runs."""
    key = (*job.model_key(), device)
    if key not in _SHARED:
        _SHARED.clear()
        release_memory()
        _SHARED[key] = job.load(device)
    return _SHARED[key]


def release_memory() -> None:
    """Return the heap pages freed so far to the operating system (glibc's ``malloc_trim``; a no-op where the C
    library has none, such as macOS)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class _Worker:
    """A Ray actor: loads the job's model once, then computes the tasks it is given."""

    def __init__(self, job, device: str | None):
        # the versions both the job's rows and the sweep's carry (the atlas's and the judge's own stamps aside)
        here, driver = fingerprint.versions(), job.versions
        changed = {k: (driver[k], here[k]) for k in here if k in driver and driver[k] != here[k]}
        if changed:
            raise ExecutorError(
                f"worker on {os.uname().nodename} has other library versions (driver, worker): "
                f"{changed}; install the same fairkv environment on every node"
            )
        self.job, self.lm = job, job.load(device)

    def compute(self, task: list) -> list[dict]:
        return [row for rows in arithmetic.computed(self.lm, self.job.compute(self.lm, [task])) for row in rows]

    def pid(self) -> int:
        return os.getpid()


@dataclass(frozen=True)
class RayExecutor:
    """Tasks spread over Ray actors.

    ``workers`` None: as many as the cluster's free resources hold (GPUs / ``gpus_per_worker`` on a GPU cluster,
    CPUs / ``cpus_per_worker`` otherwise), at most one per task. ``gpus_per_worker`` None: 1 when the cluster has
    GPUs, else 0. A worker that dies is restarted ``retries`` times, its task retried each time."""

    address: str | None = None
    workers: int | None = None
    cpus_per_worker: float = 1.0
    gpus_per_worker: float | None = None
    retries: int = 3

    def map(self, job, tasks: list) -> Iterator[list[dict]]:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        resources = ray.available_resources()
        gpus = self.gpus_per_worker if self.gpus_per_worker is not None else (1.0 if resources.get("GPU") else 0.0)
        capacity = resources.get("GPU", 0) // gpus if gpus else resources.get("CPU", 0) // self.cpus_per_worker
        n_workers = min(len(tasks), self.workers or int(capacity))
        if n_workers < 1:
            raise ExecutorError(
                f"the Ray cluster has no room for a worker needing {self.cpus_per_worker} CPU and "
                f"{gpus} GPU (free: {resources})"
            )
        worker = ray.remote(_Worker).options(
            num_cpus=self.cpus_per_worker, num_gpus=gpus, max_restarts=self.retries, max_task_retries=self.retries
        )
        actors = [worker.remote(job, "cuda" if gpus else None) for _ in range(n_workers)]
        queue, running = collections.deque(tasks), {}

        def give(actor) -> None:
            if queue:
                running[actor.compute.remote(queue.popleft())] = actor

        try:
            for actor in actors:
                give(actor)
            while running:
                (ready,), _ = ray.wait(list(running), num_returns=1)
                actor = running.pop(ready)
                try:
                    rows = ray.get(ready)
                except ray.exceptions.RayError as error:
                    raise ExecutorError(
                        f"a Ray worker failed beyond {self.retries} restarts: {error}; the rows "
                        "computed so far are in the store, rerun to compute the rest"
                    ) from error
                give(actor)
                yield rows
        finally:
            for actor in actors:
                ray.kill(actor)


def executor(spec="serial", lm: models.LoadedModel | None = None):
    """An executor from a notebook's ``executor`` parameter: "serial", "ray", a dict such as
    ``{"kind": "ray", "address": "auto", "workers": 8, "gpus_per_worker": 1}``, or an executor object."""
    if isinstance(spec, (Serial, RayExecutor)):
        return spec
    options = dict(spec) if isinstance(spec, dict) else {"kind": spec}
    kind = options.pop("kind", None)
    if kind == "serial" and not options:
        return Serial(lm)
    if kind == "ray":
        if lm is not None:
            raise ExecutorError("a loaded model (lm=) serves the serial executor only: Ray workers load their own")
        try:
            return RayExecutor(**options)
        except TypeError as error:
            raise ExecutorError(f"bad Ray executor options {options}: {error}") from error
    raise ExecutorError(f"unknown executor {spec!r}: use one of {', '.join(KINDS)} or a dict with kind 'ray'")


def _ray():
    try:
        import ray
    except ImportError as error:
        raise ExecutorError(
            "the Ray executor needs Ray: pip install 'ray==2.60.0' (or, in the clone, pip install -e '.[scale]')"
        ) from error
    return ray
