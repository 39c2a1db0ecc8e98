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

import torch
import yaml

from fairkv import audit
from fairkv import studies as claimed
from fairkv.core import arithmetic, models, progress
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
from fairkv.core.presses import PAPER, PolicyError, get_policy
from fairkv.report import figures, notebooks, outcomes, readme
from fairkv.runs import fingerprint, redecode, verify
from fairkv.runs.store import ResultsStore, StoreError

AUDIT_MODEL = "qwen2.5-coder-1.5b"


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
    (``notebooks.settle``); otherwise it goes to ``reports/<profile>/``. ``frozen``: render from the stored results
    only (``paths.frozen_run``: the kernels inherit it): a missing or stale row stops the run with an error naming it;
    notebook 00, which stores nothing (one prompt, computed as it is shown), runs as always. ``check``: frozen, and
    the committed notebooks are re-executed under nbval, ``jobs`` at a time (``notebooks.check_all``), written
    nowhere; a notebook whose output differs fails the run."""
    chosen = notebooks.numbered(names)
    parameters = parameters or {}
    profile = str(parameters.get("profile", readme.PROFILE))
    in_place = profile == readme.PROFILE and not set(parameters) - {"profile"} and not redecoded()
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


def _audit_inputs(commands) -> argparse.ArgumentParser:
    """``fairkv audit``: the prompt, the model, the policies and ratios, the queries, attacks and secrets."""
    check = commands.add_parser(
        "audit",
        help="audit your own system prompt: keep rates, leakage, compliance vs r",
        epilog="exit status: 0 audited, 1 spans not confirmed, 3 a leak with --fail-on-leak",
    )
    check.add_argument("prompt", help="text file: spans marked by '## <name>' lines, or split automatically")
    check.add_argument(
        "--model",
        default=AUDIT_MODEL,
        help=f"default {AUDIT_MODEL}: it follows instructions and defenses (SmolLM2, smollm2-135m, hardly does)",
    )
    check.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="default: bfloat16, which gives Qwen's refusals as float32 does at a third of its time here "
        "(benchmarks/precision_gate.py), or float32 on a CPU without bfloat16 arithmetic, where bfloat16 crawls",
    )
    check.add_argument(
        "--policies",
        nargs="+",
        default=list(PAPER),
        metavar="POLICY",
        help=f"policies to compare (default: all five, {' '.join(PAPER)})",
    )
    check.add_argument("--ratios", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75])
    check.add_argument("--defense", help="the defense span's name (default: 'defense', else detected)")
    check.add_argument(
        "--query",
        action="append",
        default=[],
        metavar="TEXT",
        help="a benign user query (repeatable); needed to check compliance of spans with check=",
    )
    check.add_argument("--queries-file", help="benign queries, one per line or JSONL with a 'text' field")
    check.add_argument(
        "--attacks",
        type=int,
        default=6,
        metavar="N",
        help="how many RaccoonBench attacks (the paper's, then one per category; 0: none)",
    )
    check.add_argument(
        "--attacks-file",
        help="your own attacks, one per line or JSONL with a 'text' field (run "
        "beside the --attacks N RaccoonBench ones; --attacks 0 for yours only)",
    )
    check.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="TEXT",
        help="text that must never appear in a response (repeatable; also '## <name> secret=TEXT')",
    )
    return check


def _audit_outputs(check) -> None:
    """``fairkv audit``: decoding, what fails a CI run, where the reports go."""
    check.add_argument("--show-secrets", action="store_true", help="write secrets into the reports (default: redacted)")
    check.add_argument("--max-new-tokens", type=int, default=64)
    check.add_argument("--batch-size", type=int, default=64, help="answers decoded at once")
    check.add_argument(
        "--fail-on-leak",
        action="store_true",
        help="exit with status 3 when any audited cell (up to --max-ratio) leaks: for CI",
    )
    check.add_argument("--max-ratio", type=float, help="with --fail-on-leak: only cells at r <= this count")
    check.add_argument("--out", default="audit", help="folder for report.html and report.json")
    check.add_argument("--yes", action="store_true", help="do not ask to confirm the spans")


def _store_arguments(commands) -> None:
    """``fairkv store``, ``verify``, ``restamp`` and ``redecode``: the results stores."""
    stores = commands.add_parser(
        "store",
        help="check a results store, rewrite it without duplicates, or seal its rows into gzip segments to commit",
    )
    stores.add_argument("action", choices=("check", "compact", "seal"))
    stores.add_argument(
        "paths", nargs="*", help="store files (default: every *.jsonl in the results folder and its profile folders)"
    )
    checking = commands.add_parser("verify", help="recompute random stored rows from scratch and count identical ones")
    checking.add_argument(
        "paths",
        nargs="*",
        help="store files (default: every sweep store in the results folder and "
        "its profile folders, the judge's scores among them)",
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
    _audit_outputs(_audit_inputs(commands))
    _store_arguments(commands)
    return parsed


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "redecode":
        return run_redecode(args.claims, args.profile)
    if args.command == "verify":
        paths = [Path(p) for p in args.paths] or [path for path in stores_found()]
        return run_verify(paths, args.sample, args.seed)
    if args.command == "restamp":
        return run_restamp([Path(p) for p in args.paths], args.was, args.sample, args.seed)
    if args.command == "audit":
        return run_audit(args)
    if args.command == "store":
        return run_store(args.action, [Path(p) for p in args.paths] or stores_found())
    parameters = {name: yaml.safe_load(value) for name, value in args.parameter}
    if args.jobs is not None and (args.jobs < 1 or not args.check):
        raise SystemExit("fairkv reproduce: --jobs N, N >= 1, goes with --check (other runs execute one at a time)")
    jobs = args.jobs or notebooks.CHECK_JOBS
    if args.redecoded:
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


def stores_found() -> list[Path]:
    """Every store in the results folder and in its profile folders (``fairkv.runs.studies.results_folder``)."""
    return sorted(results_dir().glob("*.jsonl")) + sorted(results_dir().glob("*/*.jsonl"))


def run_store(action: str, paths: list[Path]) -> int:
    """Print each store's check (lines, cells, duplicates, other versions, who computes it), compact or seal it."""
    if not paths:
        raise SystemExit(f"fairkv store: no store in {results_dir()}; name the files")
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
        except (verify.VerifyError, fingerprint.FingerprintError) as error:
            raise SystemExit(f"fairkv verify: {error}") from error
        print(reports[-1], flush=True)
    return int(any(report.failed for report in reports))


def run_restamp(paths: list[Path], was: str, sample: int, seed: int) -> int:
    """Verify then restamp each store; a store whose recomputed rows differ keeps its stamp (exit status 1)."""
    for path in paths:
        try:
            report, changed = verify.restamp(path, was, sample, seed, reading=outcomes.reading)
        except (verify.VerifyError, fingerprint.FingerprintError) as error:
            raise SystemExit(f"fairkv restamp: {error}") from error
        print(f"{report}\n{path}: {changed} rows restamped {was} -> {verify.stamp(report.now)}", flush=True)
    return 0


def _audit_model(args) -> models.LoadedModel:
    """The model to audit at ``--dtype``; without it bfloat16, or float32 where this CPU has no bfloat16 arithmetic
    (bfloat16 would crawl there; an audit stores no row), said so."""
    dtype = args.dtype or models.live_dtype("bfloat16")
    if not args.dtype and dtype == "float32":
        print("float32: this CPU has no bfloat16 arithmetic, where bfloat16 crawls (--dtype bfloat16 forces it)")
    return models.load_model(args.model, dtype=getattr(torch, dtype))


def run_audit(args) -> int:
    """Show the spans, ask for confirmation (unless --yes), audit, write the report, print the verdict; with
    --fail-on-leak, exit status 3 when a cell up to --max-ratio leaks."""
    try:
        secrets = {f"secret{i}": text for i, text in enumerate(args.secret, start=1)}
        queries = args.query + (audit.read_lines_or_jsonl(args.queries_file, "queries") if args.queries_file else [])
        attacks = audit.default_attacks(args.attacks) + (
            audit.read_lines_or_jsonl(args.attacks_file, "attacks") if args.attacks_file else []
        )
        spec = audit.parse(Path(args.prompt).read_text(encoding="utf-8"), queries, args.defense, secrets)
        if not attacks:
            raise audit.AuditError("no attack to run: give --attacks N > 0 or an --attacks-file")
        for policy in args.policies:
            get_policy(policy)
    except (OSError, audit.AuditError, PolicyError) as error:
        raise SystemExit(f"fairkv audit: {error}") from error
    print(f"spans of {args.prompt}:\n{spec.describe()}")
    if not args.yes and input("audit these spans? [y/N] ").strip().lower() not in ("y", "yes"):
        print("not audited: mark the spans with '## <name>' lines to split the prompt your way")
        return 1
    lm = _audit_model(args)
    cells = len(args.policies) * 3 * sum(r > 0 for r in args.ratios) + (0.0 in args.ratios)
    print(
        f"auditing {len(args.policies)} policies x {len(args.ratios)} ratios x 3 variants ({cells} caches) x "
        f"{len(attacks)} attacks + {len(spec.queries)} benign queries on {args.model} ({arithmetic.path(lm)})",
        flush=True,
    )
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fairkv-audit-") as scratch, progress.Monitor(Path(scratch) / "state"):
        result = audit.run(
            spec,
            lm,
            args.policies,
            args.ratios,
            attacks,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
        )
    result.show_secrets = args.show_secrets
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"audited in {progress.duration(time.monotonic() - began)}; report: {result.to_html(out / 'report.html')} "
        f"and {result.to_json(out / 'report.json')}"
    )
    print(result.verdict())
    print("".join(f"note: {note}\n" for note in result.notes), end="")
    leaking = result.leaking_cells(args.max_ratio)
    if args.fail_on_leak and not leaking.empty:
        cells = "; ".join(
            f"{c.policy} {c.variant} r = {c.ratio:g}: {audit.rate_words(c.leak_rate, c.attacks)}"
            for c in leaking.itertuples()
        )
        bound = "" if args.max_ratio is None else f" at r <= {args.max_ratio:g}"
        print(f"fail on leak: {len(leaking)} cell(s) leak{bound}: {cells}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
