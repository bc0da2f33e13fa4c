"""Temporary files always have names that fit (NAME_MAX: 255 bytes of the encoded name): one long
file name in a project must not make rollback, undo, the import hook's cache or a mirrored run
file impossible ("File name too long")."""
import logging
import os
import types

import pytest

from scalebox_cst import tmpnames
from scalebox_cst.project import Project
from scalebox_cst.rollback import TMP_TAG, tmp_name

from importhook_project import _fresh_import, proj  # noqa: F401 - the fixture
from test_rollback import _debris, _tree

ASCII_LONG = "a" * 248 + ".py"  # 251 bytes
UTF8_LONG = "é" * 123 + "_x.py"  # 251 bytes, 128 characters
NOT_UTF8 = os.fsdecode(b"\xff\xfe" * 120 + b".dat")  # 244 bytes, surrogate-escaped


@pytest.mark.parametrize("name", [ASCII_LONG, UTF8_LONG, NOT_UTF8, "m.py", "é" * 104 + ".py"])
@pytest.mark.parametrize("hidden", [False, True])
def test_a_temporary_sibling_fits_and_can_be_made(tmp_path, name, hidden):
    (tmp_path / name).write_bytes(b"x")  # the name itself fits
    tmp = tmpnames.sibling(str(tmp_path / name), tmpnames.writer_id(thread=True), TMP_TAG, hidden=hidden)
    base = os.path.basename(tmp)
    assert os.path.dirname(tmp) == str(tmp_path) and base.endswith(TMP_TAG)
    assert len(os.fsencode(base)) <= tmpnames.NAME_MAX
    assert base.startswith(tmpnames.stem(name, "." if hidden else "") + ".")
    with open(tmp, "wb") as fh:  # no "File name too long"
        fh.write(b"y")
    os.replace(tmp, tmp_path / name)
    assert (tmp_path / name).read_bytes() == b"y"


def test_shortened_names_keep_a_readable_prefix_and_stay_apart():
    a, b = "b" * 230 + "_one.py", "b" * 230 + "_two.py"
    ta, tb = (tmpnames.sibling(n, "1", TMP_TAG) for n in (a, b))
    assert ta != tb and ta.startswith("b" * 100)
    # UTF-8 is cut between characters, never inside one
    cut = tmpnames.stem(UTF8_LONG)
    assert cut.encode("utf-8").decode("utf-8") == cut and "~" in cut
    assert len(cut.encode("utf-8")) <= tmpnames.NAME_MAX - tmpnames.RESERVE
    # a name that is not UTF-8 keeps its bytes
    assert os.fsencode(tmpnames.stem(NOT_UTF8)).startswith(b"\xff\xfe" * 50)
    # a cache entry name: the suffix is kept whole
    fitted = tmpnames.fit("c" * 250, keep=".cpython-311-scalebox-0123456789abcdef.pyc")
    assert fitted.endswith(".cpython-311-scalebox-0123456789abcdef.pyc") and len(fitted) == tmpnames.NAME_MAX


def test_rollback_and_undo_work_with_the_longest_file_names(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    for name in (ASCII_LONG, UTF8_LONG):
        (root / "pkg" / name).write_text("v = 1\n")
    (root / "short.py").write_text("s = 1\n")
    proj, _ = Project.init(str(root))
    first = proj.commit_change(force=True).branch
    state_1 = _tree(root)
    for name in (ASCII_LONG, UTF8_LONG):
        (root / "pkg" / name).write_text("v = 2\n")
    (root / "pkg" / ("n" * 250 + ".py")).write_text("new = 1\n")  # created by the undo below
    state_2 = _tree(root)
    result = Project(str(root)).rollback(first)
    assert sorted(result.restored) == sorted(f"pkg/{n}" for n in (ASCII_LONG, UTF8_LONG))
    assert {k: v for k, v in _tree(root).items() if "nnnn" not in k} == state_1
    assert all(len(os.fsencode(os.path.basename(tmp_name(f"pkg/{n}")))) <= 255 for n in (ASCII_LONG, UTF8_LONG))
    Project(str(root)).undo()
    assert _tree(root) == state_2
    assert not _debris(root)


def test_the_import_hook_caches_a_module_with_a_long_name(proj, caplog):  # noqa: F811
    root, pkg = proj
    name = "m" * 240
    (root / pkg / f"{name}.py").write_text("def f(x):\n    return x + 1\n")
    with caplog.at_level(logging.WARNING, logger="scalebox_cst"):
        module, _ = _fresh_import(root, pkg, name=name)
        assert module.f(1) == 2
        module, _ = _fresh_import(root, pkg, name=name)  # served from the cache
        assert module.f(2) == 3
    assert not [r for r in caplog.records if "cannot write" in r.getMessage()]
    cached = [p for p in (root / ".scalebox" / "pycache" / pkg).iterdir() if p.name.startswith("m" * 100)]
    assert len(cached) == 1 and cached[0].name.endswith(".pyc") and len(cached[0].name) <= 255


def test_a_mirrored_run_file_with_a_long_name_is_written(tmp_path):
    from scalebox_cst.raylaunch import RayJob, _HostRun

    job = RayJob(branch="run/0001", commit="0" * 40, script="train.py", args=[], dir=str(tmp_path))
    host = _HostRun(str(tmp_path), job, None, None, "")
    host._tb = types.SimpleNamespace(pump=lambda path: None)
    name = "t" * 250 + ".bin"
    host.apply({"replace": {f"plots/{name}": b"data"}})
    assert (tmp_path / "plots" / name).read_bytes() == b"data"
    assert os.listdir(tmp_path / "plots") == [name]


def test_a_whole_file_write_never_goes_through_a_link_at_its_temporary_name(tmp_path):
    """Thirteen writers of whole files (run records, sites.json, the import cache, the store's
    HEAD, Ray's mirrored files...) opened their temporary with ``open(tmp, "w")``, which follows
    a link planted at that name: the link's target was overwritten, then the link renamed into
    place. They now share ``tmpnames.write_replacing``."""
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep")
    path = tmp_path / "record.json"
    tmp = tmpnames.sibling(str(path), tmpnames.writer_id())
    os.symlink(outside, tmp)
    tmpnames.write_replacing(str(path), b"new", tmp)
    assert outside.read_bytes() == b"keep" and path.read_bytes() == b"new" and not path.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["outside.txt", "record.json"]
    # a link at the destination itself is replaced, its target untouched
    os.remove(path)
    os.symlink(outside, path)
    tmpnames.write_replacing(str(path), b"again", tmp)
    assert outside.read_bytes() == b"keep" and path.read_bytes() == b"again" and not path.is_symlink()
    # a failed rename leaves no temporary behind
    folder = tmp_path / "a-folder"
    (folder / "inside").mkdir(parents=True)
    with pytest.raises(OSError):
        tmpnames.write_replacing(str(folder), b"x", str(tmp_path / "t.tmp"))
    assert not (tmp_path / "t.tmp").exists()


def test_no_engine_module_opens_a_temporary_for_writing_by_name():
    """The class, not the thirteen places: a new ``open(tmp, "w")`` in the engine would follow a
    link planted at the name (``tmpnames.write_replacing`` makes it ``O_EXCL | O_NOFOLLOW``)."""
    import ast

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = []
    for top in ("scalebox_cst", "runtime", "transforms"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open" \
                            and node.args and "tmp" in ast.unparse(node.args[0]).lower():
                        mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
                        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                            found.append(f"{os.path.relpath(path, root)}:{node.lineno}")
    assert found == [], found
