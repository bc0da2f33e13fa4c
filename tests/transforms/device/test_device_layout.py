"""The device package's shape (issue 14): no module imports in a cycle, none a reader cannot hold,
the old import paths still lead to the same objects, and the engine digest covers its files."""
from __future__ import annotations

from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import ast
import os

from scalebox_cst.config import engine_digest

HERE = TESTS
TRANSFORMS = os.path.join(os.path.dirname(HERE), "transforms")
PACKAGES = ("device", "analysis")
LIMIT = 600


def _modules():
    """{dotted name under scalebox_cst.transforms: path} of the device and analysis packages."""
    out = {}
    for package in PACKAGES:
        for root, dirs, files in os.walk(os.path.join(TRANSFORMS, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(root, name), TRANSFORMS)[:-3].replace(os.sep, ".")
                    out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(root, name)
    return out


def _imports(name, path, modules):
    """Modules of ``modules`` that ``name`` imports when it is loaded (not inside functions)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level > 1 else base
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for name in graph:
        if name not in state:
            visit(name, [])
    assert "device.analyzer.core" in graph and "device.table.swap" in graph


def test_no_module_longer_than_a_reader_can_hold():
    long = {name: n for name, path in _modules().items() if (n := sum(1 for _ in open(path, encoding="utf-8"))) > LIMIT}
    assert not long


def test_old_import_paths_lead_to_the_same_objects():
    from scalebox_cst.transforms import DEVICE_TRANSFORMS as registered
    from scalebox_cst.transforms import device, device_table

    assert device_table is device.table and device_table.TABLE is device.table.TABLE
    assert registered is device.DEVICE_TRANSFORMS
    assert [c.id for c in registered] == [
        device_table.PLACEMENT, device_table.AUTOCAST, device_table.OPTIMIZER, device_table.FUSED_OP,
        device_table.PRECISION, device_table.UNSUPPORTED,
    ]


def test_the_engine_digest_reads_the_package_files(monkeypatch, tmp_path):
    """Editing a file deep in transforms/device/ must change the fingerprint of every rewrite."""
    import builtins

    target = os.path.join(TRANSFORMS, "device", "analyzer", "legacy.py")
    real_open = builtins.open
    engine_digest.cache_clear()
    before = engine_digest()

    def edited(path, *args, **kwargs):
        fh = real_open(path, *args, **kwargs)
        if os.path.abspath(str(path)) == target and "b" in (args[0] if args else kwargs.get("mode", "r")):
            data = fh.read() + b"\n# edited\n"
            fh.close()
            copy = tmp_path / "legacy.py"
            copy.write_bytes(data)
            return real_open(copy, *args, **kwargs)
        return fh

    monkeypatch.setattr(builtins, "open", edited)
    engine_digest.cache_clear()
    try:
        assert engine_digest() != before
    finally:
        monkeypatch.undo()
        engine_digest.cache_clear()
