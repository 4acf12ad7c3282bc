"""The code's layout (issue 25): no import cycles, no private names imported across
modules, and nothing on the rank side (or shared by both sides) importing host-side
code. Every import counts, function-level ones too: a cycle hidden in a function is
still a cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import workflow_scripts

ROOT = Path(workflow_scripts.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(name: str) -> list[tuple[str, str | None]]:
    """(module imported, name imported from it) for every import in the module."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("workflow_scripts")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, *([base] if base else [])])
            if base.startswith("workflow_scripts"):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    out.append((full, None) if full in MODULES else (base, alias.name))
    return out


GRAPH = {
    m: {t for t, _ in imports(m) if t in MODULES and not t.startswith(m + ".")} for m in MODULES
}


def side(module: str) -> str:
    top = module.split(".")[1] if "." in module else ""
    if top == workflow_scripts.RANK_SIDE:
        return "rank"
    return "shared" if top in workflow_scripts.SHARED else "host"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_detector_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(GRAPH) == []


def package(module: str) -> str:
    """The package a module belongs to (``workflow_scripts.plan``), or the top-level
    module itself (``workflow_scripts.calibration``)."""
    return ".".join(module.split(".")[:2])


PACKAGE_GRAPH: dict[str, set[str]] = {}
for _m, _targets in GRAPH.items():
    PACKAGE_GRAPH.setdefault(package(_m), set()).update(
        package(t) for t in _targets if package(t) != package(_m)
    )


def test_the_packages_stand_in_layers():
    """No two packages (or top-level modules) import each other, directly or around a
    longer loop, module-level or inside a function: each package only uses the ones
    below it, so a reader can tell which is the foundation (issue 62)."""
    assert package("workflow_scripts.plan.far") == "workflow_scripts.plan"
    assert PACKAGE_GRAPH["workflow_scripts.study"] >= {
        "workflow_scripts.spec", "workflow_scripts.plan",
    }  # fmt: skip
    assert cycles(PACKAGE_GRAPH) == []


def spec_lookups(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of every string lookup in a spec: ``spec["k"]``, ``spec.get("k")``,
    on any name or attribute that says spec (``base_spec``, ``self.spec``) and on a
    record's ``["spec"]``."""

    def is_spec(node: ast.AST) -> bool:
        if isinstance(node, (ast.Name, ast.Attribute)):
            return "spec" in (node.id if isinstance(node, ast.Name) else node.attr).lower()
        if isinstance(node, ast.Subscript):
            return isinstance(node.slice, ast.Constant) and node.slice.value == "spec"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            first = node.args[0] if node.args else None
            return (
                node.func.attr == "get"
                and isinstance(first, ast.Constant)
                and (first.value == "spec")
            )
        return False

    found = []
    for n in ast.walk(tree):
        key = None
        if isinstance(n, ast.Subscript) and is_spec(n.value):
            key = n.slice.value if isinstance(n.slice, ast.Constant) else None
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args:
            if n.func.attr == "get" and is_spec(n.func.value):
                key = n.args[0].value if isinstance(n.args[0], ast.Constant) else None
        if isinstance(key, str):
            found.append((n.lineno, key))
    return found


def test_the_spec_lookup_detector_finds_every_form():
    code = (
        "a = spec['model']\nb = base_spec.get('batch_size')\nc = self.spec['precison']\n"
        "d = record['spec']['ranks']\ne = rec.get('spec').get('nodes')\nf = other['model']\n"
    )
    assert spec_lookups(ast.parse(code)) == [
        (1, "model"), (2, "batch_size"), (3, "precison"), (4, "ranks"), (5, "nodes"),
    ]  # fmt: skip


def test_every_spec_key_the_code_reads_is_declared():
    """A misspelt field fails here, not in a rare path of a trial hours into a study
    (issue 62): every key read from a spec by a string is a declared field, a key the
    loader derives, or one of the keys the host hands a rank beside the fields."""
    from workflow_scripts.experiment import EXTRA_KEYS
    from workflow_scripts.spec.fields import DERIVED_KEYS, FIELDS

    known = {*FIELDS, *DERIVED_KEYS, *EXTRA_KEYS}
    read = {
        (module, line, key)
        for module, path in MODULES.items()
        for line, key in spec_lookups(ast.parse(path.read_text()))
    }
    assert len(read) > 400  # (the detector sees the code's lookups)
    assert sorted(r for r in read if r[2] not in known) == []


def test_no_private_names_cross_modules():
    crossing = [
        f"{m} imports {name} from {target}"
        for m in MODULES
        for target, name in imports(m)
        if name and name.startswith("_") and not name.startswith("__") and target != m
    ]
    assert crossing == []


def test_the_rank_side_imports_nothing_host_side():
    sides = {m: side(m) for m in MODULES}
    assert sides["workflow_scripts.rank.harness"] == "rank"
    assert sides["workflow_scripts.rank.distributed.ccl"] == "rank"
    assert sides["workflow_scripts.trial"] == "host"
    for name in (workflow_scripts.RANK_SIDE, *workflow_scripts.SHARED):
        assert f"workflow_scripts.{name}" in MODULES, name
    crossing = [
        f"{m} ({sides[m]}) imports {t} (host)"
        for m, targets in GRAPH.items()
        for t in targets
        if sides[m] in ("rank", "shared") and sides[t] == "host"
    ]
    assert crossing == []


def test_what_a_rank_runs_lives_in_the_rank_package():
    """The layout shows the boundary: the programs a rank or a probe starts with (the
    launchers' entry, the collectives benchmark, the probe) are rank-side modules."""
    from workflow_scripts import collectives, launchers

    started = [launchers.base.ENTRY, collectives.PROGRAM, ROOT / "rank" / "probe.py"]
    for path in started:
        assert path.exists() and side(module_name(path)) == "rank", path


def top_level_names(name: str) -> set[str]:
    """What a module defines at its top level (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(MODULES[name].read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_every_import_of_the_projects_code_resolves():
    """A relative import inside a function is only run when the function is: one left
    pointing at a module that moved would fail late, in a rare path (a trial on another
    node type). Every import must name a module, or a name its module defines."""
    broken = [
        f"{m} imports {name!r} from {target}, which does not define it"
        if target in MODULES
        else f"{m} imports {target}, which does not exist"
        for m in MODULES
        for target, name in imports(m)
        if target not in MODULES or (name and name != "*" and name not in top_level_names(target))
    ]
    assert broken == []


# ---------------------------------------------------------------------------
# Snakemake's public surface (issue 37): the workflow reads only the attributes of the
# `workflow` object that Snakemake's documentation describes (docs/snakefiles/rules.rst:
# `workflow.cores`, "the number of given cores ... globally available in the Snakefile";
# `workflow.source_path`, a file relative to the current Snakefile), and hands the object
# itself to no code of its own (where its attributes would be read out of sight).
DOCUMENTED_WORKFLOW_ATTRIBUTES = {"cores", "source_path"}
REPO = ROOT.parent
_ATTRIBUTE = re.compile(r"\bworkflow\.([A-Za-z_]\w*)")
_GETATTR = re.compile(r"getattr\(\s*workflow\s*,\s*[\"'](\w+)")
_PASSED = re.compile(r"[(,]\s*workflow\s*[,)=]")


def workflow_reads(text: str, python: bool) -> list[tuple[int, str]]:
    """(line, what) for each read of a ``workflow`` attribute and each call that hands
    ``workflow`` over; Python files through their syntax tree (names, not prose)."""
    found = []
    if python:
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "workflow"
            ):
                found.append((node.lineno, node.attr))
            elif isinstance(node, ast.Call):
                args = [*node.args, *(k.value for k in node.keywords)]
                if any(isinstance(a, ast.Name) and a.id == "workflow" for a in args):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", "?")
                    if name == "getattr" and isinstance(node.args[1], ast.Constant):
                        found.append((node.lineno, str(node.args[1].value)))
                    else:
                        found.append((node.lineno, f"handed to {name}()"))
        return sorted(found)
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        found += [(number, m) for m in _ATTRIBUTE.findall(code)]
        found += [(number, m) for m in _GETATTR.findall(code)]
        found += [(number, "handed over") for _ in _PASSED.findall(_GETATTR.sub("", code))]
    return found


def undocumented(reads: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(n, what) for n, what in reads if what not in DOCUMENTED_WORKFLOW_ATTRIBUTES]


def test_the_workflow_attribute_detector_finds_undocumented_reads():
    snakefile = (
        "threads: workflow.cores  # workflow.basedir in a comment is prose\n"
        "x = workflow.non_local_exec\n"
        "y = getattr(workflow, 'remote_exec', False)\n"
        "STUDY = load(workflow, config)\n"
    )
    assert undocumented(workflow_reads(snakefile, python=False)) == [
        (2, "non_local_exec"), (3, "remote_exec"), (4, "handed over"),
    ]  # fmt: skip
    code = (
        "def f(workflow):\n"
        "    a = workflow.cores\n"
        "    b = workflow.config_settings.overwrite_config\n"
        "    c = getattr(workflow, 'is_main_process', True)\n"
        "    return g(workflow)\n"
    )
    assert undocumented(workflow_reads(code, python=True)) == [
        (3, "config_settings"), (4, "is_main_process"), (5, "handed to g()"),
    ]  # fmt: skip


def test_the_workflow_reads_only_documented_workflow_attributes():
    files = [REPO / "Snakefile", *REPO.glob("profiles/*/Snakefile"), *REPO.glob("rules/*.smk")]
    found = {}
    for path in files:
        bad = undocumented(workflow_reads(path.read_text(), python=False))
        if bad:
            found[str(path.relative_to(REPO))] = bad
    for path in ROOT.rglob("*.py"):
        bad = undocumented(workflow_reads(path.read_text(), python=True))
        if bad:
            found[str(path.relative_to(REPO))] = bad
    assert not found, f"undocumented workflow attributes read (or the object handed over): {found}"


def imported_test_modules(path: Path) -> list[str]:
    """The test modules (``test_*.py`` of tests/) that a file under tests/ imports, in
    any form: ``tests.test_x``, ``.test_x``, ``from tests import test_x``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base] + [f"{base}.{a.name}".lstrip(".") for a in node.names]
        else:
            continue
        found += [n for n in names if n.split(".")[-1].startswith("test_")]
    return found


def test_the_test_module_detector_finds_every_form(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(
        "from .test_a import x\nfrom tests.test_b import y\nfrom tests import test_c\n"
        "import tests.test_d\nfrom tests.trials import run\n"
    )
    assert imported_test_modules(f) == ["test_a", "tests.test_b", "tests.test_c", "tests.test_d"]


def test_no_test_module_imports_another():
    """Helpers shared by tests live in helper modules (tests/trials.py, runs.py, ...),
    never in a test module that another one (or a benchmark) imports."""
    tests = Path(__file__).parent
    found = {
        str(p.relative_to(tests)): imported_test_modules(p)
        for p in tests.rglob("*.py")
        if imported_test_modules(p)
    }
    assert found == {}
