"""Command line: ``fairkv reproduce`` runs the numbered notebooks through papermill.

Each notebook is executed with its own defaults plus any ``-p NAME VALUE`` overrides (values are read as YAML, as
papermill does: ``-p ratios "[0.0, 0.5]"``), and the executed copy is written under ``reports/<profile>/`` (its figure links
point to ``figures/<profile>/``). ``-p profile cpu`` runs the embedded-default reproduction
(Qwen2.5-Coder-1.5B), ``-p profile paper -p model <HF id>`` the paper's scale on a GPU.
"""

from __future__ import annotations

import argparse
import sys

import papermill
import yaml

from fairkv import figures, paper
from fairkv.paths import REPO_ROOT, reports_dir

NOTEBOOKS = REPO_ROOT / "notebooks"


def reproduce(names: list[str] | None = None, parameters: dict | None = None) -> list[str]:
    """Execute the notebooks whose file names start with one of ``names`` (all numbered ones when None)."""
    notebooks = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if names:
        notebooks = [nb for nb in notebooks if any(nb.name.startswith(n) for n in names)]
        if not notebooks:
            raise SystemExit(f"no notebook matches {names}; available: {[nb.name for nb in sorted(NOTEBOOKS.glob('*.ipynb'))]}")
    parameters = parameters or {}
    profile = str(parameters.get("profile", "ci"))
    out_dir = reports_dir() / profile
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for notebook in notebooks:
        target = out_dir / notebook.name
        print(f"running {notebook.name} -> {target}", flush=True)
        papermill.execute_notebook(str(notebook), str(target), parameters=parameters, cwd=str(out_dir))
        written.append(str(target))
    folder = figures.output_dir(profile, parameters.get("output"))
    if any((folder / "tables").glob("*_paper_vs_us.md")):
        print(f"summary: {paper.write_summary(folder, f'Paper vs us, {profile} profile')}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fairkv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("reproduce", help="execute the numbered notebooks with papermill")
    run.add_argument("notebooks", nargs="*", help="notebook number prefixes, e.g. 00 03 (default: all)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    args = parser.parse_args(argv)
    parameters = {name: yaml.safe_load(value) for name, value in args.parameter}
    reproduce(args.notebooks or None, parameters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
