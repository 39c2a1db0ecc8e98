"""Command line: ``fairkv reproduce`` runs the numbered notebooks through papermill; ``fairkv audit`` checks your own
system prompt (``fairkv.audit``); ``fairkv store check|compact|seal`` inspects, compacts or seals results stores
(``fairkv.runs.store``; sealed rows are what ``results/cpu/`` commits); ``fairkv verify`` recomputes stored rows from
scratch; ``fairkv redecode`` decodes the cells of claims near decoding noise again under another batch plan
(``fairkv.runs.redecode``), which ``fairkv reproduce --redecoded`` then reads.

Each notebook is executed with its own defaults (the cpu profile: the embedded-default reproduction,
Qwen2.5-Coder-1.5B) plus any ``-p NAME VALUE`` overrides (values are read as YAML, as papermill does: ``-p ratios
"[0.0, 0.5]"``). At its defaults the executed notebook replaces the committed one in ``notebooks/``; with overrides
(``-p profile ci``: SmolLM2, minutes; ``-p profile paper -p model <HF id>``: the paper's scale on a GPU) the executed
copy is written under ``reports/<profile>/`` (``fairkv.report.notebooks``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from fairkv import studies as claimed
from fairkv.audit import command as audit_command
from fairkv.core import progress
from fairkv.core.paths import (
    REDECODED_FOLDER,
    REDECODED_SETTING,
    REPO_ROOT,
    figures_dir,
    frozen_run,
    redecoded,
    reports_dir,
    results_dir,
)
from fairkv.report import figures, notebooks, outcomes, readme
from fairkv.runs import fingerprint, redecode, verify
from fairkv.runs import studies as profiles
from fairkv.runs.experiment import GridError
from fairkv.runs.store import ResultsStore, StoreError


def expected_time(profile: str, notebooks: list[Path]) -> str:
    """What the run should take on a 2-core machine: measured (ci) or estimated (cpu) minutes per notebook
    (each study module's ``MINUTES``)."""
    expected = claimed.expected_minutes(profile, [nb.name[:2] for nb in notebooks])
    if expected is None:
        return f"profile {profile!r} is not timed on a 2-core machine (the paper profile needs a GPU: see docs/gpu.md)"
    kind, minutes = expected
    parts = ", ".join(f"{n}: {m:g}" for n, m in minutes.items())
    return (
        f"{kind} on a 2-core machine for the {profile} profile: about {sum(minutes.values()):.0f} min "
        f"from an empty results store ({parts} min; rows already stored are not recomputed, and an "
        "interrupted run resumes where it stopped)"
    )


def reproduce(
    names: list[str] | None = None,
    parameters: dict | None = None,
    frozen: bool = False,
    check: bool = False,
    jobs: int = notebooks.CHECK_JOBS,
) -> list[str]:
    """Execute the notebooks whose file names start with one of ``names`` (all numbered ones when None), showing each
    notebook's rows done / total and ETA as its loops report them (a check: when each starts), and its wall time. At
    their defaults (the committed profile, no other parameter) the executed notebook replaces the committed one
    (``notebooks.settle``); otherwise it goes to ``reports/<profile>/``, and at the committed profile its figures,
    tables and summary to ``reports/<profile>/figures/`` (or ``output``): never over the committed ones. A notebook
    with no scale at the profile is an error where named, left out of a batch (said so). ``frozen``: render from the
    stored results only (``paths.frozen_run``: the kernels inherit it): a missing or stale row stops the run with an
    error naming it; notebook 00, which stores nothing (one prompt, computed as it is shown), runs as always.
    ``check``: frozen, and the committed notebooks are re-executed under nbval, ``jobs`` at a time
    (``notebooks.check_all``), written nowhere; a notebook whose output differs fails the run."""
    chosen = notebooks.numbered(names)
    parameters = parameters or {}
    profile = str(parameters.get("profile", readme.PROFILE))
    try:
        profiles.profile(profile)  # an unknown one named with those there are
    except GridError as error:
        raise SystemExit(f"fairkv reproduce: {error}") from error
    lacking = claimed.unscaled(profile, [notebook.name[:2] for notebook in chosen])
    said = "; ".join(f"notebook {n} runs at {', '.join(at)} only" for n, at in lacking.items())
    if lacking and names:
        raise SystemExit(f"fairkv reproduce: {said}, not at the {profile} profile")
    if lacking:
        print(f"left out at the {profile} profile: {said}", flush=True)
        chosen = [notebook for notebook in chosen if notebook.name[:2] not in lacking]
    in_place = profile == readme.PROFILE and not set(parameters) - {"profile"} and not redecoded()
    if not in_place and profile == readme.PROFILE and not redecoded():
        parameters = {"output": str(reports_dir() / profile / "figures"), **parameters}
    if check and not in_place:
        raise SystemExit(
            f"--check re-executes the committed notebooks at their defaults: no parameter but -p profile {readme.PROFILE}"
        )
    if frozen or check:
        print(
            f"frozen: rendering from the stored results in {results_dir() / profile}; nothing is computed", flush=True
        )
    else:
        print(expected_time(profile, chosen), flush=True)
    written, failed = [], []
    started = time.monotonic()
    with frozen_run(frozen or check):
        if check:
            failed = notebooks.check_all(chosen, jobs)
        else:
            written = notebooks.execute_all(chosen, parameters, None if in_place else reports_dir() / profile)
    print(f"{len(chosen)} notebook(s) in {progress.duration(time.monotonic() - started)}", flush=True)
    _pages(profile, parameters)
    if failed:
        raise SystemExit(f"nbval: {len(failed)} notebook(s) differ from their committed outputs: {', '.join(failed)}")
    return written


def _pages(profile: str, parameters: dict) -> None:
    """After the notebooks: the summary of every paper-vs-us table and, at the README's profile, its results section
    and the results pages."""
    folder = figures.output_dir(profile, parameters.get("output"))
    if any((folder / "tables").glob("*_paper_vs_us.csv")) and not redecoded():
        print(f"summary: {claimed.write_summary(folder, f'Paper vs us, {profile} profile')}")
        if profile == readme.PROFILE and parameters.get("output") is None:
            try:
                written = readme.write(REPO_ROOT / "README.md", folder, claimed.catalogue(profile), profile)
                print(f"results section: {written}")
            except readme.ReadmeError as error:
                print(f"README's results section not rewritten: {error}")


def _reproduce_arguments(commands) -> None:
    """``fairkv reproduce``: which notebooks, their papermill parameters, frozen or redecoded."""
    run = commands.add_parser("reproduce", help="execute the numbered notebooks with papermill")
    run.add_argument("notebooks", nargs="*", help="notebook number prefixes, e.g. 00 03 (default: all)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    run.add_argument(
        "--frozen",
        action="store_true",
        help="render from the stored results only: a missing or stale row is an error, nothing is computed",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="frozen, and the committed notebooks are re-executed under nbval instead of written: each cell's output "
        "must be the committed one (what CI runs)",
    )
    run.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help=f"with --check, notebooks checked at once (default here: {notebooks.CHECK_JOBS}, one a core, at most 4)",
    )
    run.add_argument(
        "--redecoded",
        action="store_true",
        help="read the cells decoded again (fairkv redecode) in place of the stored rows; the tables go to "
        "<figures>/redecoded/<profile>/, where the claims' noise column reads them",
    )


def _store_arguments(commands) -> None:
    """``fairkv store``, ``verify``, ``restamp`` and ``redecode``: the results stores."""
    stores = commands.add_parser(
        "store",
        help="check a results store, rewrite it without duplicates, or seal its rows into gzip segments to commit",
    )
    stores.add_argument("action", choices=("check", "compact", "seal"))
    stores.add_argument(
        "paths", nargs="*", help="store files (default: every store under the results folder, live or sealed)"
    )
    checking = commands.add_parser("verify", help="recompute random stored rows from scratch and count identical ones")
    checking.add_argument(
        "paths",
        nargs="*",
        help="store files (default: every store under the results folder, live or sealed: the sweeps', the atlas's, "
        "the judge's scores)",
    )
    checking.add_argument("--sample", type=int, default=20, metavar="K", help="rows to recompute per store")
    checking.add_argument("--seed", type=int, default=0)
    stamping = commands.add_parser(
        "restamp",
        help="give rows another code's stamp this checkout's, once K of them recompute identically (verify)",
    )
    stamping.add_argument("paths", nargs="+", help="store files")
    stamping.add_argument(
        "--was",
        required=True,
        help="the stamp the rows carry (versions code, /atlas for keep rates; judge for a judge's scores)",
    )
    stamping.add_argument("--sample", type=int, default=20, metavar="K", help="rows to recompute per store first")
    stamping.add_argument("--seed", type=int, default=0)
    again = commands.add_parser(
        "redecode",
        help="decode the cells of claims near decoding noise again under another batch plan (fairkv.runs.redecode)",
    )
    again.add_argument("claims", nargs="*", help="claim ids, in the order to decode (default: every claim with cells)")
    again.add_argument("--profile", default="cpu")


def parser() -> argparse.ArgumentParser:
    """The command line: ``reproduce``, ``audit``, ``store``, ``verify``, ``restamp``, ``redecode``."""
    parsed = argparse.ArgumentParser(prog="fairkv", description=__doc__)
    commands = parsed.add_subparsers(dest="command", required=True)
    _reproduce_arguments(commands)
    audit_command.arguments(commands)
    _store_arguments(commands)
    return parsed


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "redecode":
        return run_redecode(args.claims, args.profile)
    if args.command == "verify":
        paths = [Path(p) for p in args.paths] or stores_found()
        if not paths:
            raise SystemExit(
                f"fairkv verify: no store under {results_dir()} (live *.jsonl or sealed {SEGMENTS}); name one"
            )
        return run_verify(paths, args.sample, args.seed)
    if args.command == "restamp":
        return run_restamp([Path(p) for p in args.paths], args.was, args.sample, args.seed)
    if args.command == "audit":
        return audit_command.run(args)
    if args.command == "store":
        return run_store(args.action, [Path(p) for p in args.paths] or stores_found())
    parameters = {name: yaml.safe_load(value) for name, value in args.parameter}
    if args.jobs is not None and (args.jobs < 1 or not args.check):
        raise SystemExit("fairkv reproduce: --jobs N, N >= 1, goes with --check (other runs execute one at a time)")
    jobs = args.jobs or notebooks.CHECK_JOBS
    if args.redecoded:
        if set(parameters) - {"profile"}:
            raise SystemExit(
                "fairkv reproduce: --redecoded rewrites the tables the claims' noise column reads: no parameter but "
                "-p profile"
            )
        with redecoded_run(), tempfile.TemporaryDirectory(prefix="fairkv-redecoded-") as scratch:
            os.environ["FAIRKV_REPORTS_DIR"] = scratch  # the executed copies are not kept: only the tables count
            reproduce(args.notebooks or None, parameters, args.frozen, args.check, jobs)
        return 0
    reproduce(args.notebooks or None, parameters, args.frozen, args.check, jobs)
    return 0


@contextmanager
def redecoded_run():
    """Within the block (and the kernels it starts) rows decoded again are read (``FAIRKV_REDECODED=1``) and figures
    and tables go to ``<figures>/redecoded/``; the environment restored after."""
    settings = {REDECODED_SETTING: "1", "FAIRKV_FIGURES_DIR": str(figures_dir() / REDECODED_FOLDER)}
    previous = {name: os.environ.get(name) for name in [*settings, "FAIRKV_REPORTS_DIR"]}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


SEGMENTS = "*.part-[0-9][0-9][0-9][0-9].jsonl.gz"  # a sealed store's segments (``ResultsStore.segments``)


def stores_found() -> list[Path]:
    """Every store under the results folder, at any depth (a profile's folder, its atlas, operative and redecoded
    folders), each once by its path (``<model>.jsonl``): a live file, or the gzip segments it was sealed into
    (``<model>.part-NNNN.jsonl.gz``), as a clone has them."""
    root = results_dir()
    sealed = {path.with_name(path.name.rsplit(".part-", 1)[0] + ".jsonl") for path in root.rglob(SEGMENTS)}
    return sorted(sealed | set(root.rglob("*.jsonl")))


def run_store(action: str, paths: list[Path]) -> int:
    """Print each store's check (lines, cells, duplicates, other versions, who computes it), compact or seal it."""
    if not paths:
        raise SystemExit(f"fairkv store: no store under {results_dir()}; name the files")
    versions = fingerprint.versions()
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"fairkv store: no store file {path}")
        store = ResultsStore(path)
        try:
            actions = {
                "check": lambda: store.check(lambda row: fingerprint.expected(versions, row)),
                "compact": store.compact,
                "seal": store.seal,
            }
            report = actions[action]()
        except (StoreError, fingerprint.FingerprintError) as error:
            raise SystemExit(f"fairkv store {action}: {error}") from error
        print(" ".join(f"{name}={value}" for name, value in report.items()), flush=True)
    return 0


def run_redecode(ids: list[str], profile: str) -> int:
    """Decode again the cells each claim declares (``Claim.cells``), saying how many were there before."""
    declared = {claim.id: claim for claim in claimed.declared() if claim.cells}
    unknown = [i for i in ids if i not in declared]
    if unknown:
        raise SystemExit(
            f"fairkv redecode: {', '.join(unknown)} declare no cells; those that do: {', '.join(declared)}"
        )
    for claim in [declared[i] for i in ids] or list(declared.values()):
        done, total = redecode.coverage(claim.cells, profile)
        print(f"{claim.id}: {done} of {total} cells decoded again; {'; '.join(map(str, claim.cells))}", flush=True)
        redecode.run(claim.cells, profile)
    return 0


def run_verify(paths: list[Path], sample: int, seed: int) -> int:
    """Print each store's verification; exit status 1 when a store fails its rule (a row that differs other than after
    a near tie or within its tolerance, or decoded answers of other arithmetic agreeing less than native decodes)."""
    reports = []
    for path in paths:
        try:
            reports.append(verify.verify(path, sample, seed, reading=outcomes.reading))
        except (verify.VerifyError, fingerprint.FingerprintError, StoreError) as error:
            raise SystemExit(f"fairkv verify: {error}") from error
        print(reports[-1], flush=True)
    return int(any(report.failed for report in reports))


def run_restamp(paths: list[Path], was: str, sample: int, seed: int) -> int:
    """Verify then restamp each store; a store whose recomputed rows differ keeps its stamp (exit status 1)."""
    for path in paths:
        try:
            report, changed = verify.restamp(path, was, sample, seed, reading=outcomes.reading)
        except (verify.VerifyError, fingerprint.FingerprintError, StoreError) as error:
            raise SystemExit(f"fairkv restamp: {error}") from error
        print(f"{report}\n{path}: {changed} rows restamped {was} -> {verify.stamp(report.now)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
