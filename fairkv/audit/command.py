"""``fairkv audit`` on the command line: its arguments, the checks of its input before anything is asked or loaded,
and the run (``fairkv.audit``): show the spans, ask for confirmation, audit, write the reports, print the verdict.

Bad input stops the command with one line naming it (``fairkv audit: ...``), before the spans are shown and the model is
loaded where it can be told from the arguments (a ratio outside [0, 1) or given twice, a policy unknown, twice or built
per setting, more attacks than RaccoonBench has, a prompt file unreadable or not UTF-8, a ``--press`` module not
found, a mitigation unknown, given twice or one that cannot run on the prompt, a boundary share outside (0, 1)); where
it shows only at the load (a model that cannot be found, a prompt too short for a policy) it stops the same way. ``--press`` imports a user's module that registers a press of their own (``fairkv.core.presses.own``), so
``--policies`` can name it beside the paper's five.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch

from fairkv import audit
from fairkv.audit import fixes
from fairkv.core import arithmetic, models, progress
from fairkv.core.presses import BOUNDARY_SHARE, PAPER, PolicyError, VariantError, check_ratio, check_share, get_policy
from fairkv.core.presses.policy import SCORE_ONCE
from fairkv.core.prompts import PromptError

MODEL = "qwen2.5-coder-1.5b"
CONFIRM = "audit these spans? [y/N] "


def arguments(commands) -> None:
    """The ``audit`` subcommand and its arguments, on ``commands`` (an argparse subparsers object)."""
    check = _inputs(commands)
    _policies(check)
    _outputs(check)


def _inputs(commands) -> argparse.ArgumentParser:
    """``fairkv audit``: the prompt, the model, the queries, attacks and secrets."""
    check = commands.add_parser(
        "audit",
        help="audit your own system prompt: keep rates, leakage, compliance vs r",
        epilog="exit status: 0 audited, 1 spans not confirmed, 3 a leak with --fail-on-leak",
    )
    check.add_argument("prompt", help="text file: spans marked by '## <name>' lines, or split automatically")
    check.add_argument(
        "--model",
        default=MODEL,
        help=f"default {MODEL}: it follows instructions and defenses (SmolLM2, smollm2-135m, hardly does)",
    )
    check.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="default: bfloat16, which gives Qwen's refusals as float32 does at a third of its time here "
        "(benchmarks/precision_gate.py), or float32 on a CPU without bfloat16 arithmetic, where bfloat16 crawls",
    )
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


def _policies(check) -> None:
    """``fairkv audit``: the policies (a press of one's own among them, through ``--press``) and the ratios."""
    check.add_argument(
        "--policies",
        nargs="+",
        default=list(PAPER),
        metavar="POLICY",
        help=f"policies to compare (default: all five, {' '.join(PAPER)})",
    )
    check.add_argument(
        "--press",
        action="append",
        default=[],
        metavar="MODULE",
        help="a Python file (.py) or module to import first, one that registers a press of your own "
        "(fairkv.core.presses.own.register): --policies can then name it (repeatable)",
    )
    check.add_argument("--ratios", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75])
    check.add_argument(
        "--mitigations",
        nargs="+",
        metavar="FIX",
        help=f"the fixes to audit beside the base policy, of {' '.join(fixes.COMMAND)} (default: every one that "
        "applies to the prompt: the whitelist and defense-last need a defense span, defense-last one that is not last "
        "already; defense-last moves your defense span to the end)",
    )
    check.add_argument(
        "--boundary-share",
        type=float,
        default=BOUNDARY_SHARE,
        metavar="SHARE",
        help=f"boundary protection: the share of the budget kept at each boundary of the prompt, in (0, 1) (default "
        f"{BOUNDARY_SHARE:g}, arXiv 2605.18053's)",
    )


def _outputs(check) -> None:
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


def _model(args) -> models.LoadedModel:
    """The model to audit at ``--dtype``; without it bfloat16, or float32 where this CPU has no bfloat16 arithmetic
    (bfloat16 would crawl there; an audit stores no row), said so."""
    dtype = args.dtype or models.live_dtype("bfloat16")
    if not args.dtype and dtype == "float32":
        print("float32: this CPU has no bfloat16 arithmetic, where bfloat16 crawls (--dtype bfloat16 forces it)")
    return models.load_model(args.model, dtype=getattr(torch, dtype))


def _read(args) -> tuple[audit.Spec, list[str], tuple[str, ...]]:
    """The prompt's spans, the attacks and the fixes to audit, every argument checked before anything is asked or
    loaded."""
    try:
        for module in args.press:
            _import(module)
        for ratio in args.ratios:
            check_ratio(ratio)
        check_share(args.boundary_share)
        if args.max_ratio is not None:
            check_ratio(args.max_ratio)
            if not args.fail_on_leak:
                raise audit.AuditError("--max-ratio bounds --fail-on-leak's cells: give it with --fail-on-leak")
        for value, what in ((args.max_new_tokens, "max-new-tokens"), (args.batch_size, "batch-size")):
            if value < 1:
                raise audit.AuditError(f"--{what} {value}: give 1 or more")
        for given, what in ((args.ratios, "ratios"), (args.policies, "policies")):
            twice = sorted({f"{v:g}" if isinstance(v, float) else v for v in given if given.count(v) > 1})
            if twice:
                raise audit.AuditError(f"--{what}: {', '.join(twice)} given twice (each is one cell)")
        for name in args.policies:
            if get_policy(name).backend != SCORE_ONCE:
                raise PolicyError(
                    f"{name!r} is built per setting: the audit cuts every cell from one scoring pass, so it takes "
                    f"score-once policies (the paper's five: {' '.join(PAPER)})"
                )
        if args.model.startswith(("/", ".", "~")) and not Path(args.model).expanduser().is_dir():
            raise audit.AuditError(f"--model {args.model}: no such model folder")
        secrets = {f"secret{i}": text for i, text in enumerate(args.secret, start=1)}
        queries = args.query + (audit.read_lines_or_jsonl(args.queries_file, "queries") if args.queries_file else [])
        attacks = audit.default_attacks(args.attacks) + (
            audit.read_lines_or_jsonl(args.attacks_file, "attacks") if args.attacks_file else []
        )
        text = _prompt_text(Path(args.prompt))
        spec = audit.parse(text, queries, args.defense, secrets)
        if not attacks:
            raise audit.AuditError("no attack to run: give --attacks N > 0 or an --attacks-file")
        chosen = fixes.applicable(spec) if args.mitigations is None else fixes.chosen(args.mitigations, spec)
    except (OSError, audit.AuditError, PolicyError, VariantError) as error:
        raise SystemExit(f"fairkv audit: {error}") from error
    return spec, attacks, chosen


def _import(module: str) -> None:
    """Import ``module`` (a .py file, or a name on the import path): what it registers joins the policies. A file is
    imported under a name of its own (``fairkv_press_<stem>``: never over a module of its name, such as ``json``), kept
    in ``sys.modules`` so a press defined in it has a source to hash (``own.source_hash``)."""
    if not module.endswith(".py"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if not (error.name and module.startswith(error.name)):
                raise  # the module is there; what it imports is not
            raise audit.AuditError(f"--press {module}: {error} (give a .py file, or a module on the import path)")
        return
    path = Path(module).expanduser()
    if not path.is_file():
        raise audit.AuditError(f"--press {module}: no such file")
    name = f"fairkv_press_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(sys.modules[name])
    except BaseException:
        del sys.modules[name]  # no half-run module left behind
        raise


def _prompt_text(path: Path) -> str:
    """The prompt file's text: UTF-8, a byte-order mark (as some editors save it) dropped."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise audit.AuditError(
            f"{path} is not UTF-8 text (byte {error.start}: {error.reason}): save it as UTF-8"
        ) from error


def _confirmed(args, spec: audit.Spec) -> bool:
    """Show the spans and ask (unless --yes); no terminal to answer is an error that names --yes."""
    print(f"spans of {args.prompt}:\n{spec.describe()}")
    if args.yes:
        return True
    try:
        answer = input(CONFIRM)
    except EOFError:
        raise SystemExit(
            "fairkv audit: no answer to confirm the spans (standard input is closed): give --yes to audit without "
            "asking, as in CI"
        ) from None
    if answer.strip().lower() in ("y", "yes"):
        return True
    marked = audit.is_marked(_prompt_text(Path(args.prompt)))
    print("not audited" + ("" if marked else ": mark the spans with '## <name>' lines to split the prompt your way"))
    return False


def run(args) -> int:
    """Check the input, show the spans, ask for confirmation (unless --yes), audit, write the report, print the
    verdict; with --fail-on-leak, exit status 3 when a cell up to --max-ratio leaks."""
    spec, attacks, chosen = _read(args)
    if not _confirmed(args, spec):
        return 1
    try:
        lm = _model(args)
        cells = len(args.policies) * (1 + len(chosen)) * sum(r > 0 for r in args.ratios) + (0.0 in args.ratios)
        print(
            f"auditing {len(args.policies)} policies x {len(args.ratios)} ratios x the base policy and "
            f"{len(chosen)} fixes ({', '.join(chosen) or 'none'}; {cells} caches) x {len(attacks)} attacks + "
            f"{len(spec.queries)} benign queries on {args.model} ({arithmetic.path(lm)})",
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
                None if args.mitigations is None else chosen,  # None: the skipped fixes said in the notes
                max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size,
                share=args.boundary_share,
            )
    except (models.ModelError, PolicyError, PromptError, audit.AuditError) as error:
        raise SystemExit(f"fairkv audit: {error}") from error
    return _reported(args, result, time.monotonic() - began)


def _reported(args, result: audit.Audit, took: float) -> int:
    """Write the reports, print the verdict and its notes; 3 when --fail-on-leak finds a leaking cell, else 0."""
    result.show_secrets = args.show_secrets
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"audited in {progress.duration(took)}; report: {result.to_html(out / 'report.html')} "
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
