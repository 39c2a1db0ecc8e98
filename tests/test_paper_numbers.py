"""Each paper number is written once: in its claim's declaration (``fairkv.report.claims.Number`` in
``fairkv/studies/``), from which the printed paper column and the magnitude check both read it.

The check looks for the declared numbers where a claim could restate them: as a numeric literal (outside a
``Number(...)``) or as printed text ("0.55", "x1.33") in the study modules, the claim rules and the README's generator
(``WHERE``), and in the notebooks' cells. A number of three or more decimals (Table 1's 0.1963) is looked for in the
whole package: no plot margin or quantile shares it by chance, as 0.05 or 0.95 do (a study module's plot functions
own such layout numbers: their numeric literals are not read, their text is). A number that is a multiple of 0.1
is also a compression ratio or a lambda (r = 0.4, lambda = 0.2), written everywhere as a setting: those cannot be told
apart from a paper number by their text and are left out. Thresholds of our own that happen to share a value with a
paper number are listed in ``OWN`` by name, each with its reason."""

from __future__ import annotations

import ast
import json
import math
import re
import sys

from fairkv import studies
from fairkv.runs.fingerprint import PACKAGE

NOTEBOOKS = PACKAGE.parent / "notebooks"
WHERE = ("studies", "report/claims.py", "report/readme.py")  # where a claim's text is written
# module-level names (and dict names) whose values are our own thresholds, not the paper's numbers
OWN = {
    "TOLERANCE": "how far a magnitude may lie from the paper's number, per kind of quantity",
    "RATE_MARGIN": "the equivalence margin of a rate's change (one prompt in twenty)",
    "REFUSALS_DOMINATE": "the share of benign refusals from which accuracy measures over-refusal",
}


def distinctive() -> set[float]:
    """The declared paper numbers that are not multiples of 0.1 (those could be a ratio or a lambda)."""
    found = set()
    for claim in studies.declared():
        for number in claim.numbers.values():
            for value in number.value if isinstance(number.value, tuple) else (number.value,):
                if not math.isclose(value * 10, round(value * 10), abs_tol=1e-9):
                    found.add(float(value))
    return found


def _printed(value: float) -> re.Pattern:
    shown = {f"{abs(value):g}"} | (set() if _precise(value) else {f"{abs(value):.2f}"})
    return re.compile(r"(?<![\d.])(?:" + "|".join(re.escape(s) for s in shown) + r")(?![\d])")


def _skipped(tree: ast.AST) -> set[int]:
    """ids of the nodes inside a ``Number(...)`` call or the value of an ``OWN`` name, and the numeric literals of a
    plot function (one that returns a ``plt.Figure``: its margins and sizes are layout, no claim; its text is still
    read)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and ast.unparse(node.returns or ast.Constant(None)).endswith("Figure"):
            inside |= {id(c) for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, float)}
        value = None
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Number":
            value = node
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") in OWN for t in node.targets):
            value = node.value
        elif isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") in OWN:
            value = node.value
        if value is not None:
            inside |= {id(child) for child in ast.walk(value)}
    return inside


def _precise(value: float) -> bool:
    return not math.isclose(value * 100, round(value * 100), abs_tol=1e-9)


def offences(numbers: set[float]) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        inside = any(str(path.relative_to(PACKAGE)).startswith(where) for where in WHERE)
        looked = numbers if inside else {v for v in numbers if _precise(v)}
        patterns = {value: _printed(value) for value in looked}
        tree = ast.parse(path.read_text())
        skipped = _skipped(tree)
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, ast.Constant):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            if isinstance(node.value, float) and any(math.isclose(abs(node.value), v) for v in looked):
                found.append(f"{where}: the literal {node.value!r}")
            elif isinstance(node.value, str):
                found += [
                    f"{where}: {v:g} in the text {node.value[:60]!r}"
                    for v, p in patterns.items()
                    if p.search(node.value)
                ]
    patterns = {value: _printed(value) for value in numbers}
    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        for number, cell in enumerate(json.loads(notebook.read_text())["cells"]):
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                continue  # papermill's parameters: settings (ratios such as 0.25), no claim
            text = "".join(cell["source"])
            found += [f"{notebook.name} cell {number}: {v:g}" for v, p in patterns.items() if p.search(text)]
    return found


def test_every_paper_number_is_written_once():
    numbers = distinctive()
    assert len(numbers) >= 10  # the declarations are read (the check is not vacuous)
    found = offences(numbers)
    assert found == [], "paper numbers written outside their claim's declaration:\n" + "\n".join(found)


def test_the_check_finds_a_copied_number(tmp_path, monkeypatch):
    """Broken on purpose: a module quoting a declared number as text and as a literal is found twice."""
    copy = tmp_path / "fairkv"
    copy.mkdir()
    (copy / "studies").mkdir()
    (copy / "studies" / "copied.py").write_text('PAPER = "leakage 0.55 at the peak"\nVALUE = 0.55\n')
    (copy / "elsewhere.py").write_text('MARGIN = 0.55\nTABLE = "0.1963"\n')  # a plot margin may share 0.55
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    monkeypatch.setattr(sys.modules[__name__], "NOTEBOOKS", tmp_path / "none")
    assert len(offences({0.55, 0.1963})) == 3
