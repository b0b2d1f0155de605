"""docs/spec.md is generated from the spec's models (issue 33): the page on disk must
be what the generator writes now, its example must load, and every key the packaged
specs use must be on it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from corral.supervisor.spec.swarm_spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "spec.md"


def test_docs_spec_md_is_what_the_generator_writes() -> None:
    result = subprocess.run([sys.executable, "-m", "corral.supervisor.spec.spec_doc"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "| `heartbeat_s` | number | `2.0` | 0.05 to 3600 |" in result.stdout, "the generator lost the ranges"
    assert PAGE.read_text() == result.stdout, (
        "docs/spec.md is stale: run `python -m corral.supervisor.spec.spec_doc > docs/spec.md`")


def test_the_pages_example_is_a_spec_that_loads(tmp_path: Path) -> None:
    example = re.search(r"```toml\n(.*?)```", PAGE.read_text(), re.S)
    assert example is not None
    (tmp_path / "project").mkdir()
    (tmp_path / "swarm.toml").write_text(example.group(1))
    spec = load_spec(tmp_path / "swarm.toml")
    assert [agent.role for agent in spec.agents] == ["root", "specialist"]


def _keys(node: Any, place: str) -> set[tuple[str, str]]:
    """(section, key) for every key of the spec's tables; the free-form ones
    (params, a step's actions, a provider's settings) are not walked into."""
    found: set[tuple[str, str]] = set()
    for key, value in node.items():
        found.add((place, key))
        entries = value if isinstance(value, list) else [value]
        for entry in entries:
            if isinstance(entry, dict) and key not in ("params", "actions", "input", "policy"):
                found |= _keys(entry, f"{place}.{key}" if place else key)
    return found


def test_every_key_of_the_packaged_specs_is_documented_in_its_section() -> None:
    page = PAGE.read_text()
    sections = {m.group(1): m.end() for m in re.finditer(r"^#+ `\[\[?([a-z_.]+)(?:\.<name>)?\]\]?`$", page, re.M)}
    assert {"supervisor", "agents", "agents.steps", "templates", "limits", "project", "chaos"} <= set(sections)
    specs = sorted((ROOT / "corral" / "defaults").glob("*.toml"))
    assert len(specs) >= 2
    used = set().union(*(_keys(tomllib.loads(path.read_text()), "") for path in specs))
    assert ("agents", "role") in used and ("", "limits") in used and ("templates.steps", "final") in used
    missing = []
    for place, key in sorted(used):
        place = re.sub(r"^templates\.", "agents.", place)  # a template's provider keys are an agent's
        start = sections.get(place, 0)
        end = min([at for at in sections.values() if at > start] or [len(page)])
        if f"| `{key}` |" not in page[start:end] and f"`[{key}]`" not in page and f"`[[{key}]]`" not in page:
            missing.append(f"{place or 'top'}.{key}")
    assert missing == []
    assert "`specialist`" in page and "## `[[templates]]`" in page and "## `[limits]`" in page
