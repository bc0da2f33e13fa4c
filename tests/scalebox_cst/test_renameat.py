"""renameat2 through ctypes: an atomic swap and a rename that never replaces, or False where the
system cannot (the caller then falls back to os.replace)."""
import pytest

from scalebox_cst import renameat

needs = pytest.mark.skipif(renameat._renameat2 is None, reason="renameat2 is not available here")


@needs
def test_exchange_swaps_two_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A")
    b.write_text("B")
    assert renameat.exchange(str(a), str(b)) is True
    assert a.read_text() == "B" and b.read_text() == "A"
    with pytest.raises(FileNotFoundError):
        renameat.exchange(str(a), str(tmp_path / "missing"))


@needs
def test_noreplace_never_replaces(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A")
    b.write_text("B")
    with pytest.raises(FileExistsError):
        renameat.noreplace(str(a), str(b))
    assert a.read_text() == "A" and b.read_text() == "B"
    assert renameat.noreplace(str(a), str(tmp_path / "c")) is True and (tmp_path / "c").read_text() == "A"


def test_unavailable_says_so_and_touches_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(renameat, "_renameat2", None)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A")
    b.write_text("B")
    assert renameat.exchange(str(a), str(b)) is False and renameat.noreplace(str(a), str(b)) is False
    assert a.read_text() == "A" and b.read_text() == "B"
