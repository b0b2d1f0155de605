"""The project's skill catalog (seed 004 V1.25): ``.codex/skills/<name>/SKILL.md``
and ``.agents/skills/<name>/SKILL.md``, direct children only.

Only metadata reaches the prompt: the name, a one-line description, the entry path
and the SHA-256 of the file. The model reads a body with ``fs.read`` when a task
needs it. A skill is knowledge, not a tool, a permission or a plugin: nothing here
runs anything.

An entry is taken only if its directory name, its YAML front matter's ``name`` and
the seed's name rule agree (1-64 lower-case letters, digits or single hyphens,
starting and ending with a letter or digit), the front matter opens the file and
gives non-empty string ``name`` and ``description``, the file is a regular file
(no symlink anywhere on the way, checked again by the open itself) of at most
128 KiB, and its front matter nests at most MAX_FRONT_MATTER_DEPTH levels (checked
before YAML builds it: 2,000 levels raised RecursionError in the agent's first
prompt, issue 48). Every other entry is skipped with its reason. ``.codex`` wins
over ``.agents`` for the same name.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from corral.core import nesting
from corral.core.redact import redact_text

ROOTS = (".codex/skills", ".agents/skills")
MAX_SKILLS = 64
MAX_SKILL_BYTES = 128 * 1024
MAX_DESCRIPTION_BYTES = 2048
#: A skill's front matter is a flat map of a few strings; metadata may nest a little.
MAX_FRONT_MATTER_DEPTH = 16
#: Directories looked at per root before the rest is left out (and marked).
MAX_CANDIDATES = 4 * MAX_SKILLS
NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){0,63}$")


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    #: The entry path, relative to the workspace (``.codex/skills/x/SKILL.md``).
    path: str
    sha256: str
    #: Which root it came from (``.codex/skills`` or ``.agents/skills``).
    root: str


@dataclass(frozen=True)
class SkippedSkill:
    path: str
    reason: str


@dataclass(frozen=True)
class SkillCatalog:
    skills: tuple[Skill, ...] = ()
    skipped: tuple[SkippedSkill, ...] = ()
    #: Entries were left out for a budget (count, size): the catalog is not whole.
    truncated: bool = False


def _is_real(path: Path, kind: int) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_IFMT(mode) == kind


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(redact_text(text).split())
    data = flat.encode("utf-8")
    if len(data) <= limit:
        return flat
    return data[: limit - 3].decode("utf-8", errors="ignore") + "..."


def front_matter(text: str) -> dict[str, object] | str:
    """The YAML map between the first two ``---`` lines (which must open the file), or why not."""
    if not text.startswith("---\n") and not text.startswith("---\r\n"):
        return "the front matter must open the file with a --- line"
    lines = text.splitlines()
    try:
        end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---")
    except StopIteration:
        return "the front matter has no closing --- line"
    import yaml  # here: only a project with skills pays for it (every supervisor imports this module)

    body = "\n".join(lines[1:end])
    try:
        nesting.check_yaml(body, MAX_FRONT_MATTER_DEPTH)
        data = yaml.safe_load(body)
    except nesting.TooDeep as exc:
        return f"the front matter is {exc}"
    except yaml.YAMLError as exc:
        return f"the front matter is not valid YAML ({str(exc).splitlines()[0][:120]})"
    except RecursionError:  # the depth check above should make this unreachable
        return "the front matter is nested too deeply to parse"
    if not isinstance(data, dict):
        return "the front matter is not a YAML map"
    return {str(key): value for key, value in data.items()}


def _entry(root: Path, source: str, name: str, workspace_text: tuple[str, ...]) -> Skill | SkippedSkill:
    path = f"{source}/{name}/SKILL.md"
    if not NAME_RE.match(name):
        return SkippedSkill(path, "the directory name is not 1-64 lower-case letters, digits or single hyphens")
    entry = root / source / name / "SKILL.md"
    if not _is_real(root / source / name, stat.S_IFDIR) or not _is_real(entry, stat.S_IFREG):
        return SkippedSkill(path, "no regular SKILL.md (a symlink is not followed)")
    try:
        read = nesting.read_inside(root, path, MAX_SKILL_BYTES)
    except nesting.NotReadable as exc:
        return SkippedSkill(path, str(exc))
    if read.truncated:
        return SkippedSkill(path, f"larger than {MAX_SKILL_BYTES // 1024} KiB")
    data = read.data
    meta = front_matter(data.decode("utf-8", errors="replace"))
    if isinstance(meta, str):
        return SkippedSkill(path, meta)
    declared, description = meta.get("name"), meta.get("description")
    if not isinstance(declared, str) or not declared.strip():
        return SkippedSkill(path, "the front matter has no name")
    if not isinstance(description, str) or not description.strip():
        return SkippedSkill(path, "the front matter has no description")
    if declared != name:
        return SkippedSkill(path, f"the front matter's name {declared[:64]!r} is not the directory's {name!r}")
    text = description
    for where in workspace_text:  # no absolute path of this machine reaches the prompt
        text = text.replace(where, "<workspace>")
    return Skill(name, _one_line(text, MAX_DESCRIPTION_BYTES), path, hashlib.sha256(data).hexdigest(), source)


def discover(root: Path) -> SkillCatalog:
    """The catalog of ``root`` (a resolved workspace)."""
    skills: dict[str, Skill] = {}
    skipped: list[SkippedSkill] = []
    truncated = False
    for source in ROOTS:
        top, _, _ = source.partition("/")
        if not _is_real(root / top, stat.S_IFDIR) or not _is_real(root / source, stat.S_IFDIR):
            continue  # missing, or a symlink: nothing from it
        try:
            names = sorted(entry.name for entry in os.scandir(root / source))
        except OSError:
            continue
        if len(names) > MAX_CANDIDATES:
            names, truncated = names[:MAX_CANDIDATES], True
        for name in names:
            if name in skills:
                skipped.append(SkippedSkill(f"{source}/{name}/SKILL.md", f"shadowed by {skills[name].path}"))
                continue
            found = _entry(root, source, name, (str(root),))
            if isinstance(found, SkippedSkill):
                skipped.append(found)
            elif len(skills) >= MAX_SKILLS:
                truncated = True
            else:
                skills[name] = found
    ordered = tuple(sorted(skills.values(), key=lambda s: s.name))
    return SkillCatalog(ordered, tuple(skipped), truncated)
