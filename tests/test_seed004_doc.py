"""docs/seed-004.md stays true: every section of seed 004 has its row, with a status
we define, and every test a row names exists.

A row names tests as ``tests/FILE.py::test_NAME`` (or ``tests/FILE.py::Class::test_NAME``).
Each one is checked by parsing the file (ast), not by importing it: the file exists
and defines that function. A row that names a renamed or deleted test, a section
left out, or a status outside the legend fails here.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "seed-004.md"

#: Seed 004's sections: V1.1 §1-§5, V1.2-V1.43 (there is no V1.36), and V1.11.1.
SECTIONS = (
    [f"V1.1 §{n}" for n in range(1, 6)]
    + [f"V1.{n}" for n in range(2, 44) if n != 36]
    + ["V1.11.1"]
)
STATUSES = ("FULL-but-model", "FULL", "PARTIAL (minor)", "PARTIAL (major)", "MISSING", "n/a")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)((?:::\w+)+)`")
TABLE_HEADING = "## The table"


def table_rows(text: str) -> list[list[str]]:
    """The cells of each body row of the table under ``## The table``."""
    if TABLE_HEADING not in text:
        return []
    body = text.split(TABLE_HEADING, 1)[1]
    rows = []
    for line in body.splitlines():
        if line.startswith("## "):
            break
        if not line.startswith("| V1."):
            continue
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


@cache
def _defined(path: Path) -> frozenset[tuple[str, ...]]:
    """Every function of a test file, as (name,) or (Class, name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[tuple[str, ...]] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add((node.name,))
        elif isinstance(node, ast.ClassDef):
            names.update((node.name, item.name) for item in node.body
                         if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef))
    return frozenset(names)


def problems(text: str, repo: Path) -> list[str]:
    """What is wrong with the document, one line each; empty when it is true."""
    found: list[str] = []
    rows = table_rows(text)
    seen: dict[str, int] = {}
    for cells in rows:
        section = cells[0]
        seen[section] = seen.get(section, 0) + 1
        if section not in SECTIONS:
            found.append(f"{section}: not a section of seed 004")
        if len(cells) != 5:
            found.append(f"{section}: {len(cells)} cells, not 5 (section, status, where, tests, differences)")
            continue
        status = cells[1]
        if status not in STATUSES:
            found.append(f"{section}: status {status!r} is not one of {', '.join(STATUSES)}")
        refs = TEST_REF.findall(" ".join(cells[2:]))
        if status != "n/a" and not TEST_REF.findall(cells[3]):
            found.append(f"{section}: names no test in its tests column")
        for file, names in refs:
            path = repo / file
            parts = tuple(names.split("::")[1:])
            if not path.is_file():
                found.append(f"{section}: {file} does not exist")
            elif parts not in _defined(path):
                found.append(f"{section}: {file} defines no {'::'.join(parts)}")
    for section in SECTIONS:
        if section not in seen:
            found.append(f"{section}: no row")
        elif seen[section] > 1:
            found.append(f"{section}: {seen[section]} rows")
    return found


def test_every_section_has_one_row_and_every_named_test_exists() -> None:
    assert DOC.is_file(), "docs/seed-004.md is missing"
    text = DOC.read_text(encoding="utf-8")
    assert problems(text, REPO) == []


def test_the_check_finds_a_missing_section_a_renamed_test_and_a_bad_status(tmp_path: Path) -> None:
    """The checker itself: a document with each fault is caught, naming it."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        "def test_here():\n    pass\n\nclass TestBox:\n    async def test_inside(self):\n        pass\n")
    good = "`tests/test_a.py::test_here`, `tests/test_a.py::TestBox::test_inside`"
    rows = [f"| {section} | FULL | `x.py` | {good} | none |" for section in SECTIONS]
    text = "# t\n\n" + TABLE_HEADING + "\n\n| a | b | c | d | e |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    assert problems(text, tmp_path) == []

    broken = text.replace(f"| V1.14 | FULL | `x.py` | {good} | none |\n", "")
    broken = broken.replace("| V1.2 | FULL |", "| V1.2 | ALMOST |")
    broken = broken.replace(f"| V1.3 | FULL | `x.py` | {good} |",
                            "| V1.3 | FULL | `x.py` | `tests/test_a.py::test_gone` |")
    broken = broken.replace(f"| V1.4 | FULL | `x.py` | {good} |",
                            "| V1.4 | FULL | `x.py` | `tests/test_b.py::test_here` |")
    broken = broken.replace(f"| V1.6 | FULL | `x.py` | {good} |", "| V1.6 | FULL | `x.py` | none |")
    broken += f"| V1.36 | FULL | `x.py` | {good} | none |\n"
    found = problems(broken, tmp_path)
    assert sorted(found) == sorted([
        "V1.14: no row",
        f"V1.2: status 'ALMOST' is not one of {', '.join(STATUSES)}",
        "V1.3: tests/test_a.py defines no test_gone",
        "V1.4: tests/test_b.py does not exist",
        "V1.6: names no test in its tests column",
        "V1.36: not a section of seed 004",
    ])
