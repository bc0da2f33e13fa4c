"""Every ``SCALEBOX_*`` environment variable the code names is in the one list
(scalebox_cst/environment.py), every listed one is used, and docs/environment.md shows the list."""
import glob
import os
import re

from conftest import ROOT
from scalebox_cst import environment

NAME = re.compile(r"\bSCALEBOX_[A-Z0-9_]*[A-Z0-9]\b")
FOLDERS = ("scalebox_cst", "transforms", "runtime", "benchmarks", "examples")


def _code_files():
    for folder in FOLDERS:
        for ext in ("py", "c", "js", "html"):
            for path in glob.glob(os.path.join(ROOT, folder, "**", f"*.{ext}"), recursive=True):
                if os.path.abspath(path) != os.path.abspath(environment.__file__):
                    yield path


def _names_in_code():
    found = {}
    for path in _code_files():
        with open(path, encoding="utf-8", errors="replace") as f:
            for name in NAME.findall(f.read()):
                found.setdefault(name, os.path.relpath(path, ROOT))
    return found


def test_every_variable_the_code_names_is_listed():
    missing = {n: where for n, where in _names_in_code().items() if n not in environment.BY_NAME}
    assert not missing, f"add to scalebox_cst/environment.py: {missing}"


def test_every_listed_variable_is_used():
    used = _names_in_code()
    assert [v.name for v in environment.VARIABLES if v.name not in used] == []
    assert len(environment.BY_NAME) == len(environment.VARIABLES)
    assert {v.set_by for v in environment.VARIABLES} <= {"user", "engine"}


def test_the_docs_page_shows_the_list():
    with open(os.path.join(ROOT, "docs", "environment.md"), encoding="utf-8") as f:
        page = f.read()
    assert environment.markdown_table() in page, "regenerate the table: python -m scalebox_cst.environment"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "docs/environment.md" in f.read()
