"""The package's layers: ``core`` (what a row is made of) < ``runs`` (how rows are computed and kept) < ``report``
and ``audit`` (what rows say) < ``studies`` (each study's claims, declared once) < the command line. A module imports only its own layer or lower ones, and the modules'
imports (those inside functions too) form no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

from fairkv.runs.fingerprint import PACKAGE

LAYERS = {"core": 0, "runs": 1, "report": 2, "audit": 2, "studies": 3}
TOP = 4  # cli.py and the package's __init__.py


def layer(module: str) -> int:
    return LAYERS.get(module.split("/")[0], TOP) if "/" in module else TOP


def _file(dotted: list[str]) -> str | None:
    for candidate in ("/".join(dotted) + ".py", "/".join([*dotted, "__init__.py"])):
        if dotted and (PACKAGE / candidate).is_file():
            return candidate
    return None


def imports(module: str) -> set[str]:
    """The package modules (paths relative to the package) that ``module`` imports, at its top or in a function."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / module).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fairkv":
            parts = node.module.split(".")[1:]
            for alias in node.names:
                target = _file([*parts, alias.name]) or _file(parts)
                found |= {target} if target else set()
        elif isinstance(node, ast.Import):
            found |= {_file(a.name.split(".")[1:]) for a in node.names if a.name.startswith("fairkv.")} - {None}
    return found - {module}


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    return {str(path.relative_to(package)): imports(str(path.relative_to(package))) for path in package.rglob("*.py")}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state, stack = {}, []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_module_sits_in_a_layer():
    strays = [m for m in graph() if "/" not in m and m not in ("__init__.py", "cli.py")]
    assert strays == [], f"modules outside core/, runs/, report/, audit/, studies/: {strays}"


def test_no_module_imports_a_higher_layer():
    upward = [f"{m} -> {t}" for m, targets in graph().items() for t in targets if layer(t) > layer(m)]
    assert upward == [], "imports of a higher layer:\n" + "\n".join(sorted(upward))


def test_imports_form_no_cycle():
    edges = graph()
    assert "core/data.py" in edges and "core/longbench.py" in edges["core/data.py"]  # the walk sees the imports
    found = cycle(edges)
    assert found is None, "import cycle: " + " -> ".join(found)


def test_the_checks_catch_what_they_look_for():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    assert layer("core/data.py") < layer("runs/experiment.py") < layer("report/claims.py") < layer("studies/leakage.py")
    assert layer("studies/leakage.py") < layer("cli.py")
