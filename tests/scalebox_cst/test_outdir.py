"""``rewrite --out``'s writer: atomic files, no link followed below DIR (scalebox_cst.outdir)."""
import os

import pytest

from scalebox_cst import outdir


def test_a_failed_write_leaves_neither_a_partial_file_nor_a_temporary(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.py").write_bytes(b"old\n")
    real_write = os.write

    def full(fd, data):
        real_write(fd, bytes(data[:3]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError):
        outdir.write_tree(str(out), {"a.py": b"new contents\n", "b.py": b"more\n"})
    monkeypatch.undo()
    assert sorted(os.listdir(out)) == ["a.py"] and (out / "a.py").read_bytes() == b"old\n"


def test_a_link_below_out_is_refused_and_never_followed(tmp_path):
    out, target = tmp_path / "out", tmp_path / "target"
    out.mkdir()
    target.mkdir()
    os.symlink(target, out / "sub")
    with pytest.raises(outdir.OutError, match="symbolic link"):
        outdir.write_tree(str(out), {"sub/a.py": b"x\n"})
    assert os.listdir(target) == []
    outdir.write_tree(str(out), {"c/d/a.py": b"x\n"})
    assert (out / "c" / "d" / "a.py").read_bytes() == b"x\n"


def test_refusal_names_the_project_the_store_and_files_being_rewritten(tmp_path):
    root = tmp_path / "p"
    (root / ".scalebox").mkdir(parents=True)
    state = str(root / ".scalebox")
    assert "project folder" in outdir.refusal(str(root), str(root), state, {"a.py"})
    assert "project folder" in outdir.refusal(str(tmp_path), str(root), state, {"a.py"})
    assert "store" in outdir.refusal(str(root / ".scalebox" / "o"), str(root), state, {"a.py"})
    assert "would replace src/a.py" in outdir.refusal(str(root / "src"), str(root), state, {"a.py", "src/a.py"})
    assert outdir.refusal(str(root / "out"), str(root), state, {"a.py"}) is None
    assert outdir.refusal(str(tmp_path / "elsewhere"), str(root), state, {"a.py"}) is None
