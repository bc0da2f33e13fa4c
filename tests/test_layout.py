"""The shape of the package: no module of scalebox_cst/, transforms/ or runtime/ is longer than a
reader can hold (600 lines; data tables and examples aside), no module of transforms/ imports
another in a cycle (imports inside functions included: a lazy import only hides a cycle), the
vectorize family and the shared analysis are where docs/architecture.md's rooms say, and the old
import paths lead to the same objects."""
from __future__ import annotations

import ast
import os
import re
import signal
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TRANSFORMS = os.path.join(os.path.dirname(HERE), "transforms")
PACKAGE = "scalebox_cst.transforms"
ROOT = os.path.dirname(HERE)
#: the three trees of the installed package: folder, dotted name it installs as
TREES = (("scalebox_cst", "scalebox_cst"), ("transforms", "scalebox_cst.transforms"), ("runtime", "scalebox_cst.runtime"))
LIMIT = 600
#: modules still over LIMIT, each with why (dotted names under scalebox_cst)
LONG_ALLOWED: dict = {}


def _is_data(name):
    """Data tables and examples (rows a reader scans, not logic to hold): exempt from LIMIT."""
    leaf = name.rpartition(".")[2]
    return leaf == "examples" or leaf.endswith("_examples") or ".device.table." in name + "."
#: imports inside a function that read a package attribute at call time (tests replace
#: ``device.installed_torch`` there); not load-time dependencies, so not counted as edges
LAZY_LOOKUPS = {
    ("device.analyzer.calls", "device"),
    ("device.facts", "device"),
}


def _modules():
    """{dotted name relative to scalebox_cst.transforms ('' for the package): path}."""
    out = {}
    for root, dirs, files in os.walk(TRANSFORMS):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, name), TRANSFORMS)[:-3].replace(os.sep, ".")
                rel = "" if rel == "__init__" else rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
                out[rel] = os.path.join(root, name)
    return out


def _resolve(target, modules):
    """The module ``target`` names (a module of ours, or the nearest package above it)."""
    while target not in modules and "." in target:
        target = target.rpartition(".")[0]
    return target if target in modules else None


def _imports(name, path, modules):
    """Modules of ours that ``name`` imports anywhere in its text (load-time or in a function)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
                mod = node.module[len(PACKAGE) + 1:]
            else:
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}" if mod else alias.name
                targets.append(sub if sub in modules else mod)
        elif isinstance(node, ast.Import):
            targets = [a.name[len(PACKAGE) + 1:] for a in node.names if a.name.startswith(PACKAGE + ".")]
        for t in targets:
            m = _resolve(t, modules)
            # ``from .x import y`` is an edge to x (not to the package above it)
            if m is not None and m != name and (name, m) not in LAZY_LOOKUPS:
                found.add(m)
    return found


def _cycle(graph):
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack + [node, nxt]
            if nxt not in state:
                found = visit(nxt, stack + [node])
                if found:
                    return found
        state[node] = "done"
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name, [])
            if found:
                return found
    return None


def test_no_module_imports_in_a_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(c or "transforms" for c in cycle)
    assert "vectorize.recurrence.render" in graph["vectorize.recurrence.quadratic"]
    assert "vectorize.recurrence.transform" not in graph["vectorize.recurrence.quadratic"]


def test_cycle_finder_finds_a_cycle():
    """The check above can fail: a lazy import back into a module that imports it is a cycle."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _package_modules():
    """{dotted name: path} of every module of the three trees."""
    out = {}
    for folder, prefix in TREES:
        top = os.path.join(ROOT, folder)
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = os.path.relpath(root, top)
            package = prefix if rel == "." else prefix + "." + rel.replace(os.sep, ".")
            for name in files:
                if name.endswith(".py"):
                    out[package if name == "__init__.py" else f"{package}.{name[:-3]}"] = os.path.join(root, name)
    return out


def _long_modules(modules):
    long = {}
    for name, path in modules.items():
        with open(path, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > LIMIT and not _is_data(name):
            long[name] = n
    return long


def test_no_module_longer_than_a_reader_can_hold():
    modules = _package_modules()
    # the walk sees all three trees, nested packages included
    assert {"scalebox_cst.store.refs", "scalebox_cst.transforms.vectorize.recurrence.plan",
            "scalebox_cst.runtime.vectorized.recurrence_guard", "scalebox_cst.runtime.telemetry"} <= set(modules)
    long = _long_modules(modules)
    assert set(long) <= set(LONG_ALLOWED), {k: v for k, v in long.items() if k not in LONG_ALLOWED}
    assert set(LONG_ALLOWED) <= set(long), "allowed but now short: drop it from LONG_ALLOWED"


def test_only_data_tables_and_examples_are_exempt(tmp_path):
    """The size check can fail: a long module of logic is named; a long examples module is not."""
    assert _is_data("scalebox_cst.transforms.vectorize.recurrence.examples")
    assert _is_data("scalebox_cst.transforms.hot.arrays_examples")
    assert _is_data("scalebox_cst.transforms.device.table.swap")
    assert not _is_data("scalebox_cst.transforms.device.table_reader")
    assert not _is_data("scalebox_cst.runtime.vectorized.recurrence_guard")
    logic, data = tmp_path / "logic.py", tmp_path / "examples.py"
    for path in (logic, data):
        path.write_text("x = 1\n" * (LIMIT + 1))
    found = _long_modules({"scalebox_cst.runtime.logic": str(logic), "scalebox_cst.transforms.x.examples": str(data)})
    assert found == {"scalebox_cst.runtime.logic": LIMIT + 1}


@pytest.mark.parametrize("family", ["vectorize.recurrence", "vectorize.elementwise", "vectorize.reduction",
                                    "vectorize.target_update", "vectorize.scatter"])
def test_vectorize_family_lives_in_the_vectorize_package(family):
    modules = _modules()
    assert family in modules
    assert family + "_examples" in modules or family + ".examples" in modules


def test_shared_analysis_is_used_by_every_loop_family():
    """Each vectorize module that analyses loops imports transforms.analysis, not a copy."""
    modules = _modules()
    for name in ("vectorize.elementwise", "vectorize.reduction", "vectorize.target_update", "vectorize.scatter"):
        uses = _imports(name, modules[name], modules)
        assert any(m.startswith("analysis.") for m in uses), name


def test_registry_order_and_family_import_paths():
    from scalebox_cst.transforms import REGISTRY
    from scalebox_cst.transforms.vectorize.elementwise import VectorizeElementwise
    from scalebox_cst.transforms.vectorize.recurrence import VectorizeRecurrence
    from scalebox_cst.transforms.vectorize.reduction import VectorizeReduction
    from scalebox_cst.transforms.vectorize.target_update import VectorizeTargetUpdate

    assert REGISTRY[:4] == [VectorizeRecurrence, VectorizeTargetUpdate, VectorizeReduction, VectorizeElementwise]
    assert [c.id for c in REGISTRY[:4]] == [
        "vectorize.recurrence", "vectorize.target_update", "vectorize.reduction", "vectorize.elementwise"]


def _emitted_qualnames():
    """Every ``scalebox_cst.runtime...`` name the transforms write into rewritten code (module-level
    string constants: ``RUNTIME``, ``OP_QUALNAME``, ``GUARD_QUALNAME``...)."""
    found = set()
    for path in _modules().values():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) \
                    and node.value.value.startswith("scalebox_cst.runtime.") and " " not in node.value.value:
                found.add(node.value.value)
    return found


def test_names_rewritten_code_imports_resolve():
    """Rewritten code imports runtime ops by name (``from scalebox_cst.runtime.vectorized import
    ...``): each name the transforms emit still resolves, to a module or an attribute of one,
    after the runtime's modules became packages."""
    import importlib

    names = _emitted_qualnames()
    assert {"scalebox_cst.runtime.vectorized", "scalebox_cst.runtime.recurrence.linear_recurrence",
            "scalebox_cst.runtime.stabilizer.stabilize"} <= names
    for name in sorted(names - {"scalebox_cst.runtime.npu.torch_npu"}):  # npu: needs torch_npu
        try:
            importlib.import_module(name)
        except ImportError:
            module, _, attr = name.rpartition(".")
            assert hasattr(importlib.import_module(module), attr), name
    from scalebox_cst.runtime import vectorized

    # the helpers rewritten recurrences call on the vectorized package, by attribute
    for attr in ("recurrence_ok", "carry_ok", "quadratic_ok", "fused_linear", "reset_linear_recurrence",
                 "switch_linear_recurrence", "truth_of", "arrays_only", "loss_zip", "loss_range", "written_apart"):
        assert callable(getattr(vectorized, attr)), attr


def test_public_import_paths_of_split_modules():
    """The store, the import hook and the runtime's ops became packages; what other modules import
    from them is re-exported by each package, the same objects."""
    from scalebox_cst import importhook, store
    from scalebox_cst.importhook import finder, install
    from scalebox_cst.runtime import recurrence
    from scalebox_cst.runtime.recurrence import api
    from scalebox_cst.store import repository

    assert store.Store is repository.Store and issubclass(store.StoreError, Exception)
    assert importhook.install_import_hook is install.install_import_hook and importhook.ImportHook is finder.ImportHook
    assert recurrence.linear_recurrence is api.linear_recurrence


def test_setup_cfg_lists_every_package():
    """setup.cfg names its packages one by one (runtime/ and transforms/ install under
    scalebox_cst.*): a new subpackage left out installs in editable mode and goes missing from a
    wheel."""
    import configparser

    root = os.path.dirname(HERE)
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(root, "setup.cfg"))
    listed = {p.strip() for p in cfg["options"]["packages"].split() if p.strip()}
    found = set()
    for folder, prefix in (("scalebox_cst", "scalebox_cst"), ("transforms", "scalebox_cst.transforms"),
                           ("runtime", "scalebox_cst.runtime")):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            if "__init__.py" in files:
                rel = os.path.relpath(dirpath, os.path.join(root, folder))
                found.add(prefix if rel == "." else prefix + "." + rel.replace(os.sep, "."))
    assert found - listed == set(), "add to setup.cfg [options] packages"


# ------------------------------------------------------------------------------ the rooms
# runtime/ is what runs inside the user's process (imported by rewritten code, the launcher,
# telemetry); the engine core supervises runs from the host (scalebox_cst/runner/); transforms/
# emit runtime names as text. Neither side reaches into the other's room.
ROOT = os.path.dirname(HERE)
#: core modules that code in the user's process may import, each with why: leaf modules (standard
#: library only, checked below) holding one rule the host and the child must share
RUNTIME_MAY_IMPORT = {
    "scalebox_cst.tmpnames": "telemetry's atomic writes name their temp files as every writer does",
    "scalebox_cst.textlines": "served modules' linecache entries count lines as the rewrite's line maps do",
    "scalebox_cst.fused_program": "the kernel's program grammar: the runtime compiles what the engine validated",
    "scalebox_cst.options": "the option schema's defaults (the stabilizer's z, ratio, warmup): data, standard library only",
    "scalebox_cst.statedir": "a run folder's files are written in place as the host writes .scalebox/'s: never through a link",
    "scalebox_cst.oneline": "an error caught in the child reads in one line as the host's do",
    "scalebox_cst.intake": "the user's cache is read as the project's files are: regular files within a limit, no FIFO waited on",
    "scalebox_cst.digits": "ranks and settings are numbers as the host reads run numbers: ASCII digits only (standard library only)",
}


def _importer(name, path):
    """The name relative imports resolve against: a package's ``__init__`` is inside the package."""
    return f"{name}.__init__" if os.path.basename(path) == "__init__.py" else name


def _imported(source, module):
    """Every module an import in ``source`` (anywhere: a lazy import is an import) names, absolute;
    ``module`` is the importing module's dotted name (for relative imports)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: -node.level]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base in ("scalebox_cst", "scalebox_cst.runtime") or not node.module:
                out.update(f"{base}.{a.name}" for a in node.names)  # ``from pkg import module``
            else:
                out.add(base)
    return out


def _room(folder, package):
    """{dotted module name: path} of a folder installed as ``package``."""
    out = {}
    for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, name), os.path.join(ROOT, folder))[:-3].replace(os.sep, ".")
                dotted = package if rel == "__init__" else f"{package}.{rel[:-len('.__init__')] if rel.endswith('.__init__') else rel}"
                out[dotted] = os.path.join(dirpath, name)
    return out


def _host_imports(source, module):
    """Core modules (not runtime/) that in-process code ``module`` imports beyond the allowed list."""
    return sorted(
        m for m in _imported(source, module)
        if (m == "scalebox_cst" or m.startswith("scalebox_cst.")) and not m.startswith("scalebox_cst.runtime")
        and not any(m == a or m.startswith(a + ".") for a in RUNTIME_MAY_IMPORT)
    )


def _runtime_imports(source, module):
    return sorted(m for m in _imported(source, module) if m == "scalebox_cst.runtime" or m.startswith("scalebox_cst.runtime."))


def test_runtime_imports_no_host_module():
    found = {}
    for name, path in _room("runtime", "scalebox_cst.runtime").items():
        bad = _host_imports(open(path, encoding="utf-8").read(), _importer(name, path))
        if bad:
            found[name] = bad
    assert found == {}, "runtime/ runs in the user's process: move host code to scalebox_cst/ (runner/) or allow it with a reason"


def test_what_runtime_may_import_is_a_leaf():
    for name, why in RUNTIME_MAY_IMPORT.items():
        assert why
        path = os.path.join(ROOT, *name.split(".")) + ".py"
        assert [m for m in _imported(open(path, encoding="utf-8").read(), _importer(name, path)) if m.startswith("scalebox_cst")] == [], name


def test_transforms_import_nothing_from_runtime():
    found = {}
    for name, path in _room("transforms", "scalebox_cst.transforms").items():
        bad = _runtime_imports(open(path, encoding="utf-8").read(), name)
        if bad:
            found[name] = bad
    assert found == {}, "transforms emit runtime names as text; shared helpers live in the core"


def test_the_room_checks_see_every_form_of_import():
    """The two checks above can fail: lazy, relative and from-package imports are all seen."""
    assert _host_imports("def f():\n    from scalebox_cst import runs, tmpnames\n", "scalebox_cst.runtime.x") == ["scalebox_cst.runs"]
    assert _host_imports("import scalebox_cst.store\n", "scalebox_cst.runtime.x") == ["scalebox_cst.store"]
    assert _host_imports("from ..runner import supervisor\n", "scalebox_cst.runtime.x") == ["scalebox_cst.runner"]
    assert _host_imports("from . import metrics\nfrom scalebox_cst.textlines import physical_lines\n", "scalebox_cst.runtime.x") == []
    assert _runtime_imports("from scalebox_cst import runtime\n", "scalebox_cst.transforms.a") == ["scalebox_cst.runtime"]
    assert _runtime_imports("from ...runtime.loader import physical_lines\n", "scalebox_cst.transforms.a.b") == ["scalebox_cst.runtime.loader"]
    assert _runtime_imports('LINE = "from scalebox_cst.runtime.clip import clip_grad_norm"\n', "scalebox_cst.transforms.a") == []


def _calls(path, names):
    """Lines of ``path`` calling a name (or attribute) in ``names``."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) in names or getattr(node.func, "attr", None) in names)]


def test_runs_are_started_and_signals_handled_in_one_place():
    """One run supervisor (issue 22): an Execution is built only by runner.supervisor, and the
    host's signal handlers are installed only by runner.signals (the monitor, which runs nothing,
    stops its page on SIGTERM; the console scripts' entry, whose start-up handler must be in place
    before any module is imported: importing runner.signals first left a window for Ctrl-C)."""
    built, handled = {}, {}
    allowed = ("scalebox_cst.runner.signals", "scalebox_cst.cli.monitor", "scalebox_cst._entry")
    for name, path in _room("scalebox_cst", "scalebox_cst").items():
        if name != "scalebox_cst.runner.supervisor" and _calls(path, {"Execution", "TorchrunExecution"}):
            built[name] = _calls(path, {"Execution", "TorchrunExecution"})
        if name not in allowed and _calls(path, {"signal"}):
            handled[name] = _calls(path, {"signal"})
    assert built == {} and handled == {}, (built, handled)


# ---------------------------------------------------------------- tests mirror the package layout
#: tests that span the whole engine stay at the top of tests/ (faults, docs, layout, corpus, examples, public code)
CROSS_CUTTING = {
    "test_audit_public.py", "test_bench_public.py", "test_corpus.py", "test_docs.py", "test_examples.py",
    "test_faults.py", "test_faults_inputs.py", "test_faults_leaks.py", "test_faults_races.py", "test_layout.py", "test_reference_cycles.py",
    "test_sweep_regressions.py",
}
#: where a test folder's subject lives: tests/transforms/... -> transforms/..., tests/scalebox_cst/... -> scalebox_cst/...
TEST_ROOTS = ("transforms", "runtime", "scalebox_cst")


def _test_files(tests=HERE):
    for folder, dirs, files in os.walk(tests):
        dirs[:] = [d for d in dirs if d not in ("corpus", "fake_torch_npu", "__pycache__")]
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                yield os.path.relpath(os.path.join(folder, name), tests)


def layout_problems(tests=HERE, root=ROOT):
    """Test files that a newcomer would not find where the code they test lives."""
    problems, seen = [], {}
    for rel in sorted(_test_files(tests)):
        folder, name = os.path.split(rel)
        if re.search(r"issue_?\d|_\d+\.py$", name):
            problems.append(f"{rel}: named by an issue number, not by its subject")
        if name in seen:  # one basename per test: pytest imports them as top-level modules
            problems.append(f"{rel}: same name as {seen[name]}")
        seen[name] = rel
        if not folder:
            if name not in CROSS_CUTTING:
                problems.append(f"{rel}: at the top of tests/, but it tests one part: move it beside that part's path")
        elif folder.split(os.sep)[0] not in TEST_ROOTS or not os.path.isdir(os.path.join(root, folder)):
            problems.append(f"{rel}: tests/{folder} mirrors no folder of the package")
    return problems


def test_tests_mirror_the_package_layout():
    assert layout_problems() == []


def test_layout_check_finds_misplaced_tests(tmp_path):
    tests, root = tmp_path / "tests", tmp_path
    (root / "transforms" / "hot").mkdir(parents=True)
    for rel in ("transforms/hot/test_no_grad.py", "transforms/cold/test_x.py", "test_hot.py",
                "transforms/hot/test_issue_21.py", "test_layout.py", "runtime/test_no_grad.py"):
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text("")
    found = "\n".join(layout_problems(str(tests), str(root)))
    assert "transforms/cold/test_x.py: tests/transforms/cold mirrors no folder" in found
    assert "test_hot.py: at the top of tests/" in found
    assert "test_issue_21.py: named by an issue number" in found
    assert "transforms/hot/test_no_grad.py: same name as runtime/test_no_grad.py" in found
    assert "runtime/test_no_grad.py: tests/runtime mirrors no folder" in found
    assert "test_layout.py" not in found


# ---------------------------------------------------------------- one differential harness
#: the shared harness: the only test-side modules that build a Pipeline or run code as a module
HARNESS = {"harness.py", "differential.py", "recurrence_harness.py", "corpus_harness.py", "importhook_project.py"}
#: test files whose subject is the pipeline or the loading itself, each with why
OWN_MECHANICS_ALLOWED = {
    "scalebox_cst/test_pipeline.py": "its subject is the pipeline (transform instances, reuse, failures)",
    "scalebox_cst/test_config.py": "checks that building a Pipeline refuses a bad config",
    "scalebox_cst/importhook/test_importhook.py": "its subject is module loading (a finder of its own)",
    "scalebox_cst/importhook/test_importhook_lifecycle.py": "its subject is module loading (module_from_spec, then exec_module)",
}
#: test files that import another test file's fixtures (not differential helpers), each with why
TEST_IMPORTS_ALLOWED = {
    "scalebox_cst/test_tmpnames.py": "the rollback's fixtures (same folder)",
    "scalebox_cst/test_rollback_edits.py": "the rollback's fixtures (same folder)",
    "scalebox_cst/monitor/test_monitor_browser.py": "the monitor API's fixtures (same folder)",
}


def _call_name(node):
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def harness_copies(tests=HERE):
    """Test files that keep their own copy of the harness's mechanics: a ``Pipeline`` built,
    code run with ``exec`` / compiled as a module / a file loaded as one, or another test file
    imported (what broke when the tests moved folders)."""
    problems = []
    for rel in sorted(_test_files(tests)):
        if os.path.basename(rel) in HARNESS:
            continue
        with open(os.path.join(tests, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _call_name(node)
                if name == "Pipeline":
                    found.add("builds its own Pipeline (harness.rewrite / rewrite_result / pipeline)")
                elif name == "exec" and isinstance(node.func, ast.Name):
                    found.add("runs code with exec (harness.load / run_pair)")
                elif name == "compile" and isinstance(node.func, ast.Name) and any(
                        isinstance(a, ast.Constant) and a.value == "exec" for a in node.args[2:3] + [k.value for k in node.keywords if k.arg == "mode"]):
                    found.add("compiles code as a module (harness.compiled / load)")
                elif name in ("spec_from_file_location", "exec_module"):
                    found.add("loads a file as a module (harness.load_path)")
                elif name == "alarm" and isinstance(node.func, ast.Attribute):
                    found.add("sets a SIGALRM timer of its own (harness.deadline keeps pytest-timeout's)")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                if any(n.split(".")[0].startswith("test_") for n in names) and rel not in TEST_IMPORTS_ALLOWED:
                    found.add("imports another test file (shared helpers go to tests/harness.py and its siblings)")
        if rel in OWN_MECHANICS_ALLOWED:
            found = {p for p in found if p.startswith("imports")}
        problems += [f"{rel}: {p}" for p in sorted(found)]
    return problems


def test_no_test_file_keeps_its_own_harness():
    assert harness_copies() == []


def test_harness_check_finds_a_planted_copy(tmp_path):
    (tmp_path / "transforms").mkdir()
    (tmp_path / "transforms" / "test_planted.py").write_text(
        "from scalebox_cst.pipeline import Pipeline\nfrom test_other import rewrite\n\n"
        "def load(code):\n    ns = {}\n    exec(compile(code, '<t>', mode='exec'), ns)\n    return ns\n\n"
        "def run(src):\n    return Pipeline(None, 'cpu').rewrite('t.py', src)\n")
    (tmp_path / "transforms" / "test_clean.py").write_text("import harness\nx = compile('1', '<t>', 'eval')\n")
    (tmp_path / "transforms" / "test_timer.py").write_text("import signal\nsignal.alarm(20)\n")
    (tmp_path / "harness.py").write_text("exec('1')\n")
    found = harness_copies(str(tmp_path))
    assert found == [f"transforms/test_planted.py: {p}" for p in (
        "builds its own Pipeline (harness.rewrite / rewrite_result / pipeline)",
        "compiles code as a module (harness.compiled / load)",
        "imports another test file (shared helpers go to tests/harness.py and its siblings)",
        "runs code with exec (harness.load / run_pair)")] + [
        "transforms/test_timer.py: sets a SIGALRM timer of its own (harness.deadline keeps pytest-timeout's)"], found


def test_a_deadline_puts_back_the_timer_and_handler_it_found():
    """harness.deadline inside a test keeps pytest-timeout's timer for the rest of the test: the
    guard-fuzz and guard-type tests' own ``signal.alarm(0)`` cancelled it (a shuffled tests/runtime
    run showed the timer gone after each of them), and a hang after their runs had no limit."""
    import harness

    fired = []
    prior = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's, put back below
    before = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    outer = signal.getsignal(signal.SIGALRM)
    started = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 50)
        with harness.deadline(5, TimeoutError):
            assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 5
        assert 40 < signal.getitimer(signal.ITIMER_REAL)[0] <= 50 and signal.getsignal(signal.SIGALRM) is outer
        with pytest.raises(TimeoutError):
            with harness.deadline(0.05, TimeoutError):
                time.sleep(10)
        assert 40 < signal.getitimer(signal.ITIMER_REAL)[0] <= 50 and signal.getsignal(signal.SIGALRM) is outer
        # a timer that ends first still ends the block, and fires its own handler after it
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(TimeoutError):
            with harness.deadline(20, TimeoutError):
                time.sleep(10)
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fired == [signal.SIGALRM] and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if prior[0]:
            signal.setitimer(signal.ITIMER_REAL, max(prior[0] - (time.monotonic() - started), 1e-3), prior[1])
