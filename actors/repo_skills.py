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

The parse work is bounded too, before anything is built: a front matter is a name
and a description, at most MAX_FRONT_MATTER_BYTES (sized before any YAML runs) and
MAX_FRONT_MATTER_NODES (counted on the parser's events, with the depth), and all of
them together at most MAX_FRONT_MATTER_TOTAL and MAX_FRONT_MATTER_NODES_TOTAL (in
the order read: ``.codex`` first, then by name); past a total, every later skill is
skipped with that reason and the catalog is marked cut. A YAML parser's cost is per
node: 24 front matters of 122 KiB (``k: [a, b]`` lines) took 3.4 s each in the pure
parser, the agent building its prompt was killed by the stall watchdog every 30 s,
and the supervisor's stale-action guard held its loop for as long. libyaml parses
when PyYAML has it (``nesting.yaml_loader``). A ``FrontMatterMemo`` (kept by the
context cache, actors/project_context.py) hands back what an unchanged front matter
parsed to, so a rebuild (every write moves a walked directory) parses only what
changed.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from corral.core import nesting
from corral.core.path_scrub import scrub_paths
from corral.core.redact import redact_text

ROOTS = (".codex/skills", ".agents/skills")
MAX_SKILLS = 64
MAX_SKILL_BYTES = 128 * 1024
MAX_DESCRIPTION_BYTES = 2048
#: A skill's front matter is a flat map of a few strings; metadata may nest a little.
MAX_FRONT_MATTER_DEPTH = 16
#: A front matter is a name and a description (shown up to MAX_DESCRIPTION_BYTES).
MAX_FRONT_MATTER_BYTES = 8 * 1024
#: All front matter scanned for one catalog: 64 skills of 1 KiB fit with room.
MAX_FRONT_MATTER_TOTAL = 64 * 1024
#: Nodes (scalars, sequences, mappings) of one front matter: a name, a description,
#: a license, a short tool list, a little metadata need a few dozen.
MAX_FRONT_MATTER_NODES = 256
#: Nodes built for one catalog: YAML's cost is per node, and 64 KiB of
#: ``k: [a, b]`` lines is 22,000 of them (0.4 s with libyaml, 2 s without).
MAX_FRONT_MATTER_NODES_TOTAL = 4096
#: What is decoded of a file to find its front matter's closing line: the opening
#: line, the largest front matter, the closing line, with room for CRLF.
_HEAD_BYTES = MAX_FRONT_MATTER_BYTES + 64
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
    #: Left out for a budget or a failed read, not for what it holds: the catalog is
    #: then incomplete (seed 004 V1.25: "预算或读取导致的省略必须使 repository context 标记
    #: truncated=true"), where a bad name or bad YAML is simply not a skill.
    truncates: bool = False


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


Parsed = dict[str, object] | str


@dataclass
class _Parse:
    """One front matter's scan (its nodes, or why it was refused before building)
    and, once built, its map or why not."""

    nodes: int
    refused: str | None = None
    built: Parsed | None = None


class FrontMatterMemo:
    """What each front matter scanned and built to, by its text: both are functions
    of the text alone, so an entry is never stale. Holds the front matters of the
    last catalog only (at most MAX_FRONT_MATTER_TOTAL of text). ``parses`` counts
    the parser's runs, a scan or a build each (what a rebuild cost)."""

    def __init__(self) -> None:
        self._kept: dict[str, _Parse] = {}
        self._seen: dict[str, _Parse] = {}
        self.parses = 0

    def scan(self, body: str) -> _Parse:
        found = self._seen.get(body) or self._kept.get(body)
        if found is None:
            self.parses += 1
            found = scan_front_matter(body)
        self._seen[body] = found
        return found

    def build(self, body: str) -> Parsed:
        """The map ``body`` holds, or why not (after ``scan`` found it within bounds)."""
        found = self.scan(body)
        if found.built is None:
            self.parses += 1
            found.built = build_front_matter(body)
        return found.built

    def end_catalog(self) -> None:
        """Keep what this catalog parsed, drop the rest."""
        self._kept, self._seen = self._seen, {}


def split_front_matter(data: bytes) -> str | tuple[str]:
    """The text between the first two ``---`` lines (which must open the file), or
    ``(why not,)``. Only the file's first _HEAD_BYTES are decoded and split: a
    front matter past MAX_FRONT_MATTER_BYTES is refused before it is looked at."""
    if not data.startswith(b"---\n") and not data.startswith(b"---\r\n"):
        return ("the front matter must open the file with a --- line",)
    cut = len(data) > _HEAD_BYTES
    lines = data[:_HEAD_BYTES].decode("utf-8", errors="replace").splitlines()
    if cut:
        lines.pop()  # the last line may be cut short: a "---" there may go on
    try:
        end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---")
    except StopIteration:
        if cut:
            return (f"the front matter is larger than {MAX_FRONT_MATTER_BYTES // 1024} KiB",)
        return ("the front matter has no closing --- line",)
    body = "\n".join(lines[1:end])
    if len(body.encode("utf-8", "surrogatepass")) > MAX_FRONT_MATTER_BYTES:
        return (f"the front matter is larger than {MAX_FRONT_MATTER_BYTES // 1024} KiB",)
    return body


def scan_front_matter(body: str) -> _Parse:
    """Depth and nodes first, on the parser's events (nothing is built)."""
    import yaml  # here: only a project with skills pays for it (every supervisor imports this module)

    try:
        return _Parse(nesting.yaml_nodes(body, MAX_FRONT_MATTER_DEPTH, MAX_FRONT_MATTER_NODES, nesting.yaml_loader()))
    except (nesting.TooDeep, nesting.TooMany) as exc:
        return _Parse(0, f"the front matter is {exc}" if isinstance(exc, nesting.TooDeep)
                      else f"the front matter has {exc}")
    except yaml.YAMLError as exc:
        return _Parse(0, f"the front matter is not valid YAML ({str(exc).splitlines()[0][:120]})")


def build_front_matter(body: str) -> Parsed:
    """The YAML map ``body`` holds, or why not, by libyaml's safe loader (the pure
    one without libyaml); ``scan_front_matter`` found it within bounds first."""
    import yaml

    try:
        data = yaml.load(body, Loader=nesting.yaml_loader())  # a safe loader, libyaml's or the pure one
    except yaml.YAMLError as exc:
        return f"the front matter is not valid YAML ({str(exc).splitlines()[0][:120]})"
    except RecursionError:  # the depth scan makes this unreachable
        return "the front matter is nested too deeply to parse"
    if not isinstance(data, dict):
        return "the front matter is not a YAML map"
    return {str(key): value for key, value in data.items()}


@dataclass
class _Budget:
    """What is still to be parsed for this catalog: front matter bytes (what the
    scans read) and nodes (what building costs, about 10 us a node with libyaml)."""

    bytes_left: int = MAX_FRONT_MATTER_TOTAL
    nodes_left: int = MAX_FRONT_MATTER_NODES_TOTAL
    spent_out: bool = False

    def spend(self, size: int, nodes: int | None) -> bool:
        """Take ``size`` bytes (``nodes`` nodes, once scanned); False, and False for
        every later one, once one does not fit: which skills count never depends on
        the sizes of those after it."""
        fits = size <= self.bytes_left and (nodes is None or nodes <= self.nodes_left)
        self.spent_out = self.spent_out or not fits
        if self.spent_out:
            return False
        self.bytes_left -= size
        self.nodes_left -= nodes or 0
        return True


def _entry(root: Path, source: str, name: str, workspace_text: tuple[str, ...], budget: _Budget,
           memo: FrontMatterMemo) -> Skill | SkippedSkill:
    path = f"{source}/{name}/SKILL.md"
    if not NAME_RE.match(name):
        return SkippedSkill(path, "the directory name is not 1-64 lower-case letters, digits or single hyphens")
    entry = root / source / name / "SKILL.md"
    if not _is_real(root / source / name, stat.S_IFDIR) or not _is_real(entry, stat.S_IFREG):
        return SkippedSkill(path, "no regular SKILL.md (a symlink is not followed)")
    try:
        read = nesting.read_inside(root, path, MAX_SKILL_BYTES)
    except nesting.NotReadable as exc:
        return SkippedSkill(path, str(exc), truncates=True)
    if read.truncated:
        return SkippedSkill(path, f"larger than {MAX_SKILL_BYTES // 1024} KiB", truncates=True)
    data = read.data
    body = split_front_matter(data)
    if isinstance(body, tuple):
        return SkippedSkill(path, body[0])
    spent = (f"the skills' front matter budget ({MAX_FRONT_MATTER_TOTAL // 1024} KiB,"
             f" {MAX_FRONT_MATTER_NODES_TOTAL} YAML nodes in all) was spent on the skills read before it")
    if not budget.spend(len(body.encode("utf-8", "surrogatepass")), None):
        return SkippedSkill(path, spent, truncates=True)
    scanned = memo.scan(body)
    if scanned.refused is not None:
        return SkippedSkill(path, scanned.refused)
    if not budget.spend(0, scanned.nodes):
        return SkippedSkill(path, spent, truncates=True)
    meta = memo.build(body)
    if isinstance(meta, str):
        return SkippedSkill(path, meta)
    declared, description = meta.get("name"), meta.get("description")
    if not isinstance(declared, str) or not declared.strip():
        return SkippedSkill(path, "the front matter has no name")
    if not isinstance(description, str) or not description.strip():
        return SkippedSkill(path, "the front matter has no description")
    if declared != name:
        return SkippedSkill(path, f"the front matter's name {declared[:64]!r} is not the directory's {name!r}")
    # No absolute path of this machine reaches the prompt, the workspace's or any
    # other ("描述清洗凭据和绝对路径"); credentials go in ``_one_line``.
    text = scrub_paths(description, workspace_text)
    return Skill(name, _one_line(text, MAX_DESCRIPTION_BYTES), path, hashlib.sha256(data).hexdigest(), source)


def discover(root: Path, memo: FrontMatterMemo | None = None) -> SkillCatalog:
    """The catalog of ``root`` (a resolved workspace). ``memo``: front matter parsed
    by an earlier catalog, not parsed again (a fresh one when not given)."""
    memo = memo if memo is not None else FrontMatterMemo()
    budget = _Budget()
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
            found = _entry(root, source, name, (str(root),), budget, memo)
            if isinstance(found, SkippedSkill):
                skipped.append(found)
                truncated = truncated or found.truncates
            elif len(skills) >= MAX_SKILLS:
                truncated = True
            else:
                skills[name] = found
    memo.end_catalog()
    truncated = truncated or budget.spent_out
    ordered = tuple(sorted(skills.values(), key=lambda s: s.name))
    return SkillCatalog(ordered, tuple(skipped), truncated)


#: The prompt's skill section, heading, rules and notes included, is at most this
#: (seed 004 V1.25: "prompt 中 Skill metadata section 最大 4 KiB").
MAX_SKILLS_BYTES = 4 * 1024
SKILLS_HEADING = "PROJECT SKILL CATALOG (UNTRUSTED DISCOVERY METADATA)"
SKILLS_LEAD = "Skills of this project (knowledge, not tools or permissions):"
SKILL_RULES = (
    "Skills are workflow knowledge, not tools or permissions. Before acting on a matching skill, read its entry"
    " with fs.read; its scripts run only through the command tools. The applicable AGENTS.md wins over a skill."
)


@dataclass(frozen=True)
class SkillSection:
    """The prompt's skill section as its parts (joined by blank lines), and whether
    an entry was left out for its 4 KiB: the catalog then counts as truncated
    ("预算或读取导致的省略必须使 repository context 标记 truncated=true")."""

    parts: list[str]
    cut: bool


def skill_section(catalog: SkillCatalog) -> SkillSection:
    """What the prompt shows of ``catalog``: each skill's name, description, entry
    path and whole SHA-256, as many as fit the section's 4 KiB."""
    if not catalog.skills and not catalog.skipped:
        return SkillSection([], False)
    notes: list[str] = []
    if catalog.truncated:
        notes.append("[... the catalog is incomplete: some entries passed its limits]")
    if catalog.skipped:
        notes.append(f"(skipped entries: {len(catalog.skipped)}; project.index says why)")
    more = "[... {} more skills not shown: project.index lists them]"
    # The fixed parts first; the entries get what is left, with room for the "more" line.
    fixed = "\n\n".join([SKILLS_HEADING, SKILL_RULES, SKILLS_LEAD]) + "".join(f"\n{note}" for note in notes)
    room = MAX_SKILLS_BYTES - len(fixed.encode()) - len(more.format(len(catalog.skills)).encode()) - 1
    lines: list[str] = []
    cut = False
    for skill in catalog.skills:
        line = (f"- {skill.name}: {skill.description} (read {skill.path} with fs.read when a task needs it;"
                f" sha256 {skill.sha256})")
        room -= len(line.encode()) + 1
        if room < 0:
            lines.append(more.format(len(catalog.skills) - len(lines)))
            cut = True
            break
        lines.append(line)
    return SkillSection([SKILLS_HEADING, SKILL_RULES, SKILLS_LEAD + "\n" + "\n".join(lines + notes)], cut)
