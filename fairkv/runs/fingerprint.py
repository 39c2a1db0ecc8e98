"""A fingerprint of the code that decides a result row: every row carries it, and rows of other code never mix.

Library versions do not change when our own code does: a second local run would replay rows that older presses, an
older engine or older prompt code computed. A fingerprint hashes the **definitions** a kind of row is computed by, not
the files they live in. It starts from the row's entry points (``SWEEP``: ``experiment.run``, every grid's rows;
``ATLAS``: the atlas's keep rates; ``JUDGE``: the judge's scores; ``OPERATIVE``: the whitelist phrase's keep rates) and
follows every name they use, through any fairkv module, to the definition it names: functions, classes, constants, top-level statements of a module it reaches, and the import statement of every
outside library name (``from kvpress import SnapKVPress``). Each definition counts by its syntax tree without
docstrings, without the module it lives in or the fairkv imports that reach it (``data.load_records`` reads as
``load_records``), and without the text of the errors it raises (a raise ends a row; which error, and when, count).
So:

- an edit of a comment, a docstring, an error message or the formatting keeps the fingerprint, and any other edit of
  code a row runs does not;
- a pure move of a module (``fairkv/data.py`` to ``fairkv/core/data.py``, its imports updated) keeps it;
- a definition no row reaches (a figure, a claim, a notebook's helper) never changes it, even in a module rows use.

Modules in ``NEUTRAL`` run rows but cannot change their content (where files live, progress bars, the store's locking
and format, the runner's store loop and the executors that carry tasks and rows, this module): a name taken from them counts by its module's name
and its own, not its definition, so pointing the code at another definition still changes the fingerprint.

Which rows a study asks for is not how a row is computed: every field that selects a row (model, precision, prompt,
order, setting, query, token budget) is in its cell id. So the declarations of scale (``SCALE``: the profiles, the shared
scales and the study machinery of ``fairkv.runs.studies``) count like a neutral module, by name (each study's own scale
is declared in its module of ``fairkv.studies``, which no row reaches),
and the field defaults of the plans that carry a scale (``PLANS``: ``experiment.Grid``, ``atlas.Plan``) read as
absent: a study grown to 200 prompts, or a profile given other ratios, keeps every fingerprint, and its new rows join
the old ones in the same store.

A press is its own unit (issue 69): each policy is one binding of ``core/presses/policies.py`` (``DECLARATIONS``),
which no entry point reaches (the registry gathers the bindings without naming them), and each row that ran a press
carries the stamp of that press beside its code's (``press_stamp``: the binding walked as a root, so its build, its
settings and its span-local score; ``stamped``, ``expected``). Adding a press keeps every other row's stamps, and an
edit of one press's declaration or scoring moves that press's rows' stamp alone.

``versions`` stamps ``code_fingerprint()`` and the libraries' versions on every row; ``experiment.run`` refuses a
store whose rows carry another, and ``fairkv restamp`` (``verify.restamp``) gives rows a new fingerprint only after
recomputing a sample of them identically. The judge's scores (``fairkv.runs.judge``) carry a fingerprint of their
own (``JUDGE``, the judge's ``Job``): they never depend on the sweep's code, only on the responses they judge.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path

import fairkv
from fairkv.core import metrics
from fairkv.core.presses import policies, registry

PACKAGE = Path(__file__).resolve().parents[1]
# The entry points of each kind of row (package-relative module, colon, name). A move updates these paths only.
SWEEP = ("runs/experiment.py:run",)  # every grid's rows, of any press of the catalogue and either backend
ATLAS = ("runs/atlas.py:run",)  # the press atlas's keep rates
JUDGE = ("runs/judge.py:Job",)  # the judge's scores (notebook 10), the calibration's among them
OPERATIVE = ("runs/operative.py:run",)  # the keep rates of the defense's operative words (notebook 06)
NEUTRAL = (
    "core/arithmetic.py",  # the arithmetic path: stamped on each row in a field of its own, as the CPU it ran on
    "core/paths.py",
    "core/progress.py",
    "runs/store.py",
    "runs/runner.py",
    "runs/executors.py",
    "runs/fingerprint.py",
)
DECLARATIONS = "core/presses/policies.py"  # one binding per policy: the root of its rows' press stamp
OWN = "core/presses/policy.py:KIND_SCORERS"  # a press of one's own: its source, and its kind's span-local scores
SCALE = ("runs/studies.py",)  # which rows each study and profile asks for: counted by name, like NEUTRAL
PLANS = ("runs/experiment.py:Grid", "runs/atlas.py:Plan")  # their field defaults are a scale: not counted


class FingerprintError(ValueError):
    """An entry point that names no definition."""


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def _bound(statement: ast.stmt) -> set[str]:
    """The module-level names a top-level statement binds (through ``if`` / ``try`` blocks too)."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in statement.names}
    if isinstance(statement, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
        inner = [s for block in ("body", "orelse", "finalbody", "handlers") for s in getattr(statement, block, [])]
        inner = [s for item in inner for s in (item.body if isinstance(item, ast.ExceptHandler) else [item])]
        return set().union(*(_bound(s) for s in inner)) if inner else set()
    targets = {
        ast.Assign: lambda s: s.targets,
        ast.AnnAssign: lambda s: [s.target],
        ast.AugAssign: lambda s: [s.target],
    }.get(type(statement))
    if targets is None:
        return set()
    return {node.id for target in targets(statement) for node in ast.walk(target) if isinstance(node, ast.Name)}


@dataclass
class _Module:
    """One package module: its top-level statements by the names they bind, and where its imported names point."""

    path: str  # relative to the package, e.g. "presses/selection.py"
    statements: list[ast.stmt]
    # name -> indices of the statements that bind it (imports bind names too, but live in ``internal`` / ``external``)
    binders: dict[str, list[int]] = field(default_factory=dict)
    internal: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # name -> (module path, attribute)
    external: dict[str, str] = field(default_factory=dict)  # name -> its import, as text

    @property
    def package(self) -> list[str]:
        return self.path.split("/")[:-1]


def _module_path(dotted: list[str]) -> str | None:
    """The package-relative file of the fairkv module ``dotted`` (without the leading ``fairkv``), if there is one."""
    for candidate in ("/".join(dotted) + ".py", "/".join(dotted + ["__init__.py"])):
        if candidate != ".py" and (PACKAGE / candidate).is_file():
            return candidate
    return None


@lru_cache(maxsize=None)
def _module(path: str) -> _Module:
    """The module at ``path`` (package-relative), parsed once."""
    tree = _without_docstrings(ast.parse((PACKAGE / path).read_text()))
    module = _Module(path, tree.body)
    for index, statement in enumerate(tree.body):
        for name in _bound(statement) if not _is_import(statement) else ():
            module.binders.setdefault(name, []).append(index)
        for node in ast.walk(statement):
            if isinstance(node, ast.ImportFrom):
                base = module.package[: len(module.package) - node.level + 1] if node.level else []
                dotted = [*base, *(node.module.split(".") if node.module else [])]
                if node.level or dotted[:1] == ["fairkv"]:
                    dotted = dotted[1:] if not node.level else dotted
                    for alias in node.names:
                        target = _module_path([*dotted, alias.name])
                        local = alias.asname or alias.name
                        module.internal[local] = (target, None) if target else (_module_path(dotted), alias.name)
                    continue
                for alias in node.names:
                    text = f"from {node.module} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                    module.external[alias.asname or alias.name] = text
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "fairkv":
                        dotted = alias.name.split(".")[1:]
                        module.internal[alias.asname or "fairkv"] = (
                            (_module_path(dotted), None) if alias.asname else ("__init__.py", None)
                        )
                    else:
                        text = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                        module.external[(alias.asname or alias.name).split(".")[0]] = text
    return module


def _is_import(statement: ast.stmt) -> bool:
    return isinstance(statement, (ast.Import, ast.ImportFrom))


class _Unqualified(ast.NodeTransformer):
    """``data.load_records`` (``data`` a fairkv module) reads as ``load_records``: the module a definition lives in
    is not part of it, however the code reaches it."""

    def __init__(self, module: _Module) -> None:
        self.module = module

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name):
            target = self.module.internal.get(node.value.id)
            if target and target[1] is None:
                return ast.Name(id=node.attr, ctx=node.ctx)
        return self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        """An import of a fairkv module inside a function is dropped, as at the top: where a module lives is not
        code, and an import may move between a function and its module's top."""
        internal = node.level or (node.module or "").split(".")[0] == "fairkv"
        return None if internal else node

    def visit_Import(self, node: ast.Import) -> ast.AST | None:
        return None if any(alias.name.split(".")[0] == "fairkv" for alias in node.names) else node

    def visit_Raise(self, node: ast.Raise) -> ast.AST:
        """The text of an error is not code a row's content depends on (a raise ends the row): its strings read as
        empty, so a message may name a moved module or say more, while the exception raised and when still count."""
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call):
                inner.args = [_blank(arg) for arg in inner.args]
        return self.generic_visit(node)


def _blank(node: ast.expr) -> ast.expr:
    """A string or f-string read as an empty string."""
    is_text = isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))
    return ast.Constant(value="") if is_text else node


def _is_plan(path: str, index: int) -> bool:
    """The statement at ``index`` of ``path`` defines one of ``PLANS``."""
    statement = _module(path).statements[index]
    return isinstance(statement, ast.ClassDef) and f"{path}:{statement.name}" in PLANS


def _without_defaults(plan: ast.ClassDef) -> ast.ClassDef:
    """A plan's class with its fields' defaults removed (``n_prompts: int | None = 4`` reads ``n_prompts: int |
    None``): which rows a plan asks for by default is a scale, and every field that selects a row is in its cell id."""
    plan = copy.deepcopy(plan)
    for statement in plan.body:
        if isinstance(statement, ast.AnnAssign):
            statement.value = None
    return plan


class _Walk:
    """The definitions reachable from some entry points, collected as the texts that are hashed."""

    def __init__(self) -> None:
        self.texts: set[str] = set()
        self.seen: set[tuple[str, int]] = set()
        self.modules: set[str] = set()

    def statement(self, path: str, index: int) -> None:
        if (path, index) in self.seen:
            return
        self.seen.add((path, index))
        module = _module(path)
        statement = _without_defaults(module.statements[index]) if _is_plan(path, index) else module.statements[index]
        if not _is_import(statement):
            self.texts.add(ast.dump(_Unqualified(module).visit(copy.deepcopy(statement))))
        self.enter(path)
        for node in ast.walk(statement):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                target = module.internal.get(node.value.id)
                if target and target[1] is None and target[0]:
                    self.name(target[0], node.attr)
            if isinstance(node, ast.Name):
                self.local(module, node.id)

    def enter(self, path: str) -> None:
        """A module's statements that bind no name run whenever it is imported: they count once it is reached."""
        if path in self.modules:
            return
        self.modules.add(path)
        for index, statement in enumerate(_module(path).statements):
            if not _bound(statement) and not _is_import(statement):
                self.statement(path, index)

    def local(self, module: _Module, name: str) -> None:
        if name in module.binders:
            for index in module.binders[name]:
                self.statement(module.path, index)
        elif name in module.internal:
            path, attribute = module.internal[name]
            if attribute is not None and path:
                self.name(path, attribute)
        elif name in module.external:
            self.texts.add(module.external[name])

    def name(self, path: str, attribute: str) -> None:
        """``attribute`` as the module at ``path`` defines or imports it."""
        if path in NEUTRAL or path in SCALE:
            self.texts.add(f"{Path(path).stem}.{attribute}")
            return
        module = _module(path)
        if not {attribute} & (module.binders.keys() | module.internal.keys() | module.external.keys()):
            submodule = _module_path([*module.package, attribute])
            if submodule is None:
                raise FingerprintError(f"fairkv/{path} defines no {attribute!r}")
            self.enter(submodule)
            return
        self.local(module, attribute)


def definitions(roots: tuple[str, ...]) -> set[str]:
    """The hashed texts of the definitions reachable from ``roots`` (``"module.py:name"``, package-relative)."""
    walk = _Walk()
    for root in roots:
        path, _, name = root.partition(":")
        if not (PACKAGE / path).is_file() or name not in _module(path).binders:
            raise FingerprintError(f"fingerprint entry point {root!r}: fairkv/{path} defines no {name!r}")
        walk.name(path, name)
    return walk.texts


def of(roots: tuple[str, ...]) -> str:
    """12 hex digits of sha256 over the sorted texts of the definitions reachable from ``roots``."""
    digest = hashlib.sha256()
    for text in sorted(definitions(roots)):
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:12]


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The fingerprint of ``SWEEP``: what every grid row carries."""
    return of(SWEEP)


def press_stamp(policy: str) -> str:
    """The fingerprint of the press a row ran (``policy``: its key, label or class name): its binding in
    ``DECLARATIONS`` as a root, so the stamp covers how the press is built, its settings and its scoring (Appendix
    F's span-local score among them) and nothing of another press's. No entry point reaches a binding (the registry
    gathers them without naming them): a press added or edited moves only its own rows' stamp. A press of one's own
    (``presses.own``) is stamped by the hash of its source, which its cell ids hold too, and the span-local scores of
    its kind (``OWN``: ``own.register`` picks one of them). A press this process does not know (one's own, registered
    in another) is an error naming it."""
    try:
        found = registry.runnable([policy])[0]
    except registry.PolicyError as error:
        raise FingerprintError(
            f"rows of press {policy!r}, which this process does not know ({error}): a press of one's own is "
            "registered first (fairkv.core.presses.own.register), as where its rows were computed"
        ) from None
    if found.source:
        return f"{found.source}/{_stamp_of(OWN)}"
    return _stamp_of(f"{DECLARATIONS}:{policies.BINDINGS[found.key]}")


@lru_cache(maxsize=None)
def _stamp_of(root: str) -> str:
    return of((root,))


def stamped(versions: dict, policy: str | None) -> dict:
    """``versions`` with the stamp of the press ``policy`` (none for the uncompressed cache: None or "none")."""
    return dict(versions) if policy in (None, "none") else {**versions, "press": press_stamp(policy)}


def expected(versions: dict, row: dict) -> dict:
    """The versions a stored ``row`` must carry for code of ``versions``: theirs, with the stamp of the press the row
    ran (a grid's and the operative words' rows name it ``policy``, the atlas's ``press``; a judge's score none)."""
    return stamped(versions, row.get("policy", row.get("press")))


def clear() -> None:
    """Forget parsed modules and fingerprints (after the package's files changed, or ``PACKAGE`` moved)."""
    _module.cache_clear()
    code_fingerprint.cache_clear()
    _stamp_of.cache_clear()


def versions() -> dict[str, str]:
    """Versions that determine a result: ours, our result code's fingerprint, the scorer's and the libraries'."""
    return {
        "fairkv": fairkv.__version__,
        "code": code_fingerprint(),
        "metrics": metrics.METRICS_VERSION,
        **{name: version(name) for name in ("torch", "transformers", "kvpress", "lm-eval", "rouge-score")},
    }
