"""The package's layers: ``core`` (what a row is made of) < ``runs`` (how rows are computed and kept) < ``report``
and ``audit`` (what rows say) < ``studies`` (each study's claims, declared once) < the command line. A module imports only its own layer or lower ones, and the modules'
imports (those inside functions too) form no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import kvpress

from fairkv.core.presses import registry
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


MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 450, 60, 6  # issue 54: rooms a newcomer can read whole


def oversized(source: str, name: str = "<module>") -> list[str]:
    """What in ``source`` is over the sizes above: the module over ``MAX_MODULE_LINES`` lines, a function over
    ``MAX_FUNCTION_LINES`` lines or ``MAX_PARAMETERS`` parameters (``self`` / ``cls`` not counted) unless a comment on
    its ``def`` line (or the line its signature closes on) says why."""
    lines = source.splitlines()
    found = [f"{name}: {len(lines)} lines"] if len(lines) > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = node.args
        names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
        count = len(names) - (names[:1] in (["self"], ["cls"])) + bool(arguments.vararg) + bool(arguments.kwarg)
        length = node.end_lineno - node.lineno + 1
        signature = lines[node.lineno - 1 : node.body[0].lineno - 1]
        said = any("#" in line for line in signature[:1] + signature[-1:])
        if (count > MAX_PARAMETERS or length > MAX_FUNCTION_LINES) and not said:
            found.append(f"{name}:{node.lineno} {node.name}: {count} parameters, {length} lines")
    return found


def test_no_room_is_too_big_without_saying_why():
    found = [item for path in sorted(PACKAGE.rglob("*.py")) for item in oversized(path.read_text(), str(path))]
    assert found == [], "over the sizes of issue 54, without a comment on the def line saying why:\n" + "\n".join(found)


def test_the_size_check_catches_what_it_looks_for():
    seven = "def f(a, b, c, d, e, f, g):\n    return a\n"
    assert oversized(seven) == ["<module>:1 f: 7 parameters, 2 lines"]
    assert oversized("def f(a, b, c, d, e, f, g):  # 7: the fields of a setting\n    return a\n") == []
    assert oversized("class C:\n    def f(self, a, b, c, d, e, f):\n        return a\n") == []  # self not counted
    assert oversized("def f():\n" + "    x = 1\n" * 60) == ["<module>:1 f: 0 parameters, 61 lines"]
    assert oversized("x = 1\n" * 451) == ["<module>: 451 lines"]


# issue 69: each policy is one object (fairkv/core/presses/policy.py), declared once (policies.py); the code rows run
# through asks a policy, never checks a press's class or a policy's key
ENGINE = ("core", "runs")
PRESS_CLASSES = {name for name in dir(kvpress) if name.endswith("Press")} - {"BasePress", "ScorerPress"}


def branches_on_a_policy(source: str) -> list[str]:
    """Where ``source`` checks a kvpress press's class (``isinstance``, ``type(...) is``) or compares a value with a
    policy's key."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
            named = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(node.args[1])}
            found += [f"{node.lineno}: isinstance of {name}" for name in sorted(named & PRESS_CLASSES)]
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = {getattr(n, "id", None) or getattr(n, "attr", None) for side in sides for n in ast.walk(side)}
            found += [f"{node.lineno}: compared with {name}" for name in sorted(named & PRESS_CLASSES)]
            keys = {side.value for side in sides if isinstance(side, ast.Constant)} & set(registry.REGISTRY)
            found += [f"{node.lineno}: compared with {key!r}" for key in sorted(keys)]
    return found


def test_no_code_rows_run_through_branches_on_a_policy():
    engine = [p for p in sorted(PACKAGE.rglob("*.py")) if str(p.relative_to(PACKAGE)).split("/")[0] in ENGINE]
    found = [
        f"{path.relative_to(PACKAGE)}:{where}" for path in engine for where in branches_on_a_policy(path.read_text())
    ]
    assert found == [], "a policy's behaviour belongs to its policy.Policy:\n" + "\n".join(found)


def test_the_policy_check_catches_what_it_looks_for():
    assert branches_on_a_policy("isinstance(press, StreamingLLMPress)") == ["1: isinstance of StreamingLLMPress"]
    assert branches_on_a_policy("isinstance(p, (kvpress.SnapKVPress, X))") == ["1: isinstance of SnapKVPress"]
    assert branches_on_a_policy("type(press) is TOVAPress") == ["1: compared with TOVAPress"]
    assert branches_on_a_policy("if policy != 'streamingllm': pass") == ["1: compared with 'streamingllm'"]
    assert branches_on_a_policy("isinstance(press, ScorerPress) and policy.key == key") == []
