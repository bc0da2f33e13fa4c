"""The README is the front door and the reference lives in docs/: short table cells, links that
resolve, and code citations (``docs/architecture.md``, ``scalebox_cst/x.py``) that name real files."""
import glob
import os
import re

import pytest

from conftest import ROOT

PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
CELL_LIMIT = 300
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _cells(text):
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("|"):
            yield from (c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|")))


@pytest.mark.parametrize("path", PAGES, ids=os.path.basename)
def test_no_table_cell_is_a_page(path):
    with open(path, encoding="utf-8") as f:
        long = [c[:60] for c in _cells(f.read()) if len(c) > CELL_LIMIT]
    assert not long


@pytest.mark.parametrize("path", PAGES, ids=os.path.basename)
def test_relative_links_resolve(path):
    with open(path, encoding="utf-8") as f:
        targets = [t for t in LINK.findall(f.read()) if "://" not in t]
    missing = [t for t in targets if not os.path.exists(os.path.join(os.path.dirname(path), t))]
    assert not missing


def test_the_readme_is_a_front_door():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert "make demo" in text and "make test" in text and "docs/architecture.md" in text
    assert len(text.splitlines()) < 150


def test_cited_design_and_layout_files_exist():
    """Docstrings and comments cite docs pages that exist (report.py cited a DESIGN.md, runs.py a
    RUN_LAYOUT.md, neither of which was in the repository)."""
    cited = set()
    for folder in ("scalebox_cst", "transforms", "runtime"):
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            with open(path, encoding="utf-8") as f:
                cited |= set(re.findall(r"\b(?:docs/)?[A-Za-z_]+\.md\b", f.read()))
    missing = sorted(c for c in cited if c != "README.md" and not os.path.exists(
        os.path.join(ROOT, c if c.startswith("docs/") else os.path.join("docs", c))))
    assert not missing


def test_every_transform_has_its_entry_in_the_transforms_page():
    """docs/transforms.md is where a user reads what a site's transform does and how exact it is:
    hot.fresh_on_device was registered and reported for months without an entry there."""
    from scalebox_cst.transforms import REGISTRY

    with open(os.path.join(ROOT, "docs", "transforms.md"), encoding="utf-8") as fh:
        page = fh.read()
    missing = [cls.id for cls in REGISTRY if f"**`{cls.id}`**" not in page and f"`{cls.id}`" not in page]
    assert not missing, f"no entry in docs/transforms.md for {missing}"
