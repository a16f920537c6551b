"""The docs point at code that exists: every row of docs/architecture.md's concept table names a
file of the repository and names defined in it, and every relative link of the README and the
docs pages leads to a file that is there (a moved file or a renamed class fails here, not in a
newcomer's hands)."""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DOCS = os.path.join(ROOT, "docs")


def _concept_rows() -> list[tuple[str, str, list[str]]]:
    with open(os.path.join(DOCS, "architecture.md"), encoding="utf-8") as fh:
        text = fh.read()
    table = text.split("## Where each concept lives", 1)[1].split("\n## ", 1)[0].split("And in detail", 1)[1]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        names = re.findall(r"`([A-Za-z_][\w.]*)`", cells[2])
        rows.append((cells[0], cells[1].strip("`"), names))
    return rows


ROWS = _concept_rows()


def test_the_ten_core_concepts_each_name_a_file_that_is_there() -> None:
    with open(os.path.join(DOCS, "architecture.md"), encoding="utf-8") as fh:
        text = fh.read()
    short = text.split("## Where each concept lives", 1)[1].split("And in detail", 1)[0]
    rows = [line.split("|")[1:3] for line in short.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == 10, rows
    for concept, where in rows:
        path = where.split("`")[1]
        assert os.path.isfile(os.path.join(ROOT, path)), f"{concept.strip()}: {path} is not a file"


def test_the_concept_table_has_the_ten_core_concepts() -> None:
    concepts = " | ".join(c for c, _, _ in ROWS)
    for noun in ("route lookup", "pull loop", "tag filter", "min-unconsumed rule", "transactional sink",
                 "commit log", "consume queue", "reset following", "group membership", "Arrow decode"):
        assert noun in concepts, noun


def _defined(source: str, name: str) -> bool:
    return re.search(rf"^\s*(class|def|async def)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]", source,
                     re.MULTILINE) is not None


@pytest.mark.parametrize("concept, path, names", ROWS, ids=[r[0] for r in ROWS])
def test_each_concept_names_a_file_and_names_defined_there(concept: str, path: str, names: list[str]) -> None:
    full = os.path.join(ROOT, path)
    assert os.path.isfile(full), f"{concept}: {path} is not a file of the repository"
    with open(full, encoding="utf-8") as fh:
        source = fh.read()
    assert names, f"{concept}: no name given"
    for name in names:
        for part in name.split("."):
            assert _defined(source, part), f"{concept}: {part} (of {name}) is not defined in {path}"


def _pages() -> list[str]:
    return [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))


@pytest.mark.parametrize("page", _pages(), ids=os.path.basename)
def test_relative_links_lead_to_files_that_are_there(page: str) -> None:
    with open(page, encoding="utf-8") as fh:
        text = fh.read()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(page), path))):
            missing.append(target)
    assert not missing, f"{os.path.relpath(page, ROOT)} links to files that are not there: {missing}"
