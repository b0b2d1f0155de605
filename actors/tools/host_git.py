"""corral's own git, on the host: it never runs a program the repository names, and
never shows a secret file.

The project.git_* tools run git outside the sandbox, with the user's rights, on a
repository an agent's commands could have written (a process session can create
``.git`` and run for hours before the sandbox's check removes it; a cloned repository
comes with its config). Git runs programs that config names: hooks,
``core.fsmonitor``, ``diff.external`` and diff drivers (``textconv``, ``command``),
filter drivers (``clean``, ``smudge``, ``process``, under any driver name the
attributes pick), the pager, credential helpers, ``core.sshCommand``, gpg, editors.
So every git here runs:

* a git from outside the project only (``trusted_git``: one the project holds, first on
  PATH, is refused);
* with no system or global config (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL`` and
  ``HOME`` pointing at nothing), a scrubbed environment, no pager (``--no-pager``) and
  no optional locks (``GIT_OPTIONAL_LOCKS=0``: a status writes nothing);
* with the workspace as the only place a repository is looked for
  (``GIT_CEILING_DIRECTORIES`` is its parent), never an implicit bare repository
  (``safe.bareRepository=explicit``), and only if the work tree is the workspace
  (``core.worktree`` could point git at ``/``);
* with settings on the command line, which beat the repository's own: hooks at
  ``/dev/null``, no fsmonitor, no credential helper, no ssh command, no transport at
  all (``protocol.allow=never``), no signing, no submodule recursion, no automatic gc;
* with every filter driver the repository's config defines (read first with ``git
  config --list``, which runs nothing) emptied, so no attribute can select a program;
* ``diff`` with ``--no-ext-diff --no-textconv``.

Running git inside the sandbox instead was the other choice; it was not taken because
a commit must write ``.git``, which the sandbox keeps read-only, and the programs
would still run there with write access to the repository they came from.

Paths that hold secrets (the deny list's secret patterns, databases, names that say
they hold secrets, keys or a dump, another VCS's control directory, corral's home,
other names of a secret file) are left out of status and diff: by their names, and
by pathspec exclusion so their content never reaches the output.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from corral.sandbox.control_paths import refusal, scan_controls

GIT_TIMEOUT_S = 30
#: A repository naming more filter drivers than this is refused (each one is a setting).
MAX_DRIVERS = 500
#: More secret paths to leave out of a diff than this, and the diff is refused.
MAX_EXCLUDED = 2000

#: Settings from the command line beat every config file of the repository.
_SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.pager", "cat"),
    ("core.sshCommand", ""),
    ("core.askPass", ""),
    ("core.editor", ":"),
    ("core.attributesFile", "/dev/null"),
    ("credential.helper", ""),
    ("protocol.allow", "never"),
    ("safe.bareRepository", "explicit"),
    ("commit.gpgSign", "false"),
    # No identity guessed from the host name: a commit without one fails.
    ("user.useConfigOnly", "true"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("submodule.recurse", "false"),
    ("diff.ignoreSubmodules", "all"),
    ("status.submoduleSummary", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("color.ui", "false"),
)

#: Databases hold application data (and often credentials): never shown either.
DATABASE_PATTERNS: tuple[str, ...] = (
    "*.db", "*.sqlite", "*.sqlite3", "*.db3", "*.db-wal", "*.db-shm", "*.db-journal", "*.sqlite-wal",
    "*.sqlite-shm", "*.sqlite-journal", "*.mdb", "*.accdb", "*.dump",
)  # fmt: skip
_DATABASE_RE = re.compile("|".join(fnmatch.translate(pattern) for pattern in DATABASE_PATTERNS))

#: Names that say what they hold (seed 004 V1.4: "密钥、凭据、数据库、dump … 不得出现在返回值或
#: diff 中"): a secret word as a whole word of the name (``secrets.yaml``, ``client_secret.json``,
#: ``db-dump.sql``), or a directory of that name, when the name is data, not code: ``tokenizer.py`` and
#: ``password.py`` are a project's own modules, a review shows them. The sandbox's SECRET_PATTERNS
#: (files no tool reads) stay narrower: hiding a file from a review costs nothing, refusing a read of
#: ``passwords.txt`` could stop a task.
SECRET_WORDS = ("secret", "secrets", "credential", "credentials", "password", "passwords", "passwd", "apikey",
                "api_key", "api-key", "private_key", "private-key", "token", "tokens", "dump", "dumps")
_SECRET_WORD_RE = re.compile(r"(?:^|[._-])(?:" + "|".join(re.escape(word) for word in SECRET_WORDS) + r")(?:[._-]|$)")
#: Suffixes of code: a name with one is never hidden by its words alone.
_CODE_SUFFIXES = frozenset({
    "py", "pyi", "js", "mjs", "cjs", "ts", "tsx", "jsx", "go", "rs", "java", "kt", "c", "h", "cc", "cpp", "hpp",
    "cs", "rb", "php", "swift", "m", "scala", "sh", "lua", "html", "css", "vue", "svelte", "md", "rst",
})  # fmt: skip
#: Key stores and their kin, whatever their name.
KEY_STORE_PATTERNS: tuple[str, ...] = ("*.jks", "*.keystore", "*.kdbx", "*.ppk", "*.gpg", "*.htpasswd", ".htpasswd",
                                       "*.rdb", "*.hprof")
_KEY_STORE_RE = re.compile("|".join(fnmatch.translate(pattern) for pattern in KEY_STORE_PATTERNS))
#: Other version-control systems' control directories (git's own is refused as a control path).
VCS_DIRS = frozenset({".hg", ".svn", ".bzr", "_darcs", ".fossil", "CVS"})


def secret_named(parts: Sequence[str]) -> bool:
    """Whether a path (its parts) names secrets, keys, a dump or another VCS's control
    directory, by its names alone (beyond the deny list's patterns and databases)."""
    for index, part in enumerate(parts):
        lowered = part.lower()
        if part in VCS_DIRS or _KEY_STORE_RE.match(lowered):
            return True
        last = index == len(parts) - 1
        if last and "." in lowered.lstrip(".") and lowered.rsplit(".", 1)[1] in _CODE_SUFFIXES:
            continue
        if _SECRET_WORD_RE.search(lowered):
            return True
    return False

_FILTER_KEY = re.compile(r"^filter\.(?P<name>.+)\.(?:clean|smudge|process|required)$", re.DOTALL)


class HostGitError(RuntimeError):
    """Git failed or the repository cannot be handled safely; the message says why."""


def _environment(workspace: Path, settings: Sequence[tuple[str, str]], extra: Mapping[str, str]) -> dict[str, str]:
    env = {
        **extra,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "HOME": "/nonexistent",
        "XDG_CONFIG_HOME": "/nonexistent",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_CEILING_DIRECTORIES": str(workspace.parent),
        "GIT_NO_REPLACE_OBJECTS": "1",
        # No optional lock: a read (status) never takes the index lock to rewrite the
        # index with refreshed stat data (seed 004 V1.4). A commit's own locks are not
        # optional and still hold (git_exact_commit.py).
        "GIT_OPTIONAL_LOCKS": "0",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LC_ALL": "C",
        # Settings in the environment, not argv: a driver name can hold any character,
        # and `-c name=value` would split it at the first '='.
        "GIT_CONFIG_COUNT": str(len(settings)),
    }
    for index, (key, value) in enumerate(settings):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def trusted_git(workspace: Path) -> str:
    """The git executable on PATH, resolved, and never one inside the project: an agent's
    commands can write the project, and this git runs on the host with the user's rights
    (seed 004 V1.4: "Git 进程使用项目外受信可执行文件")."""
    found = shutil.which("git", path=os.environ.get("PATH", "/usr/bin:/bin"))
    if found is None:
        raise HostGitError("cannot run git: no git on PATH")
    executable = Path(found).resolve()
    if executable.is_relative_to(workspace.resolve()):
        raise HostGitError("the git found on PATH is inside the project; corral runs only a git from outside it")
    return str(executable)


def _run(
    workspace: Path, settings: Sequence[tuple[str, str]], args: Sequence[str], extra: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [trusted_git(workspace), "--no-pager", *args],
            cwd=workspace,
            env=_environment(workspace, settings, extra or {}),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise HostGitError(f"git {args[0]} took longer than {GIT_TIMEOUT_S}s") from None
    except OSError as exc:
        raise HostGitError(f"cannot run git: {exc.strerror or exc}") from None


def driver_names(listing: str) -> list[str]:
    """Filter driver names a ``git config --list -z`` output defines (each entry is
    ``key\\nvalue``; section and variable names are lower case, a driver name as written)."""
    names: dict[str, None] = {}
    for entry in listing.split("\0"):
        key = entry.split("\n", 1)[0]
        match = _FILTER_KEY.match(key)
        if match is not None:
            names[match.group("name")] = None
    return list(names)


def neutralizing_settings(names: Sequence[str]) -> list[tuple[str, str]]:
    """An empty command for every driver: git then runs nothing for it (and a driver
    that was ``required`` does not fail the command for lack of one)."""
    settings: list[tuple[str, str]] = []
    for name in names:
        settings += [(f"filter.{name}.clean", ""), (f"filter.{name}.smudge", ""), (f"filter.{name}.process", ""),
                     (f"filter.{name}.required", "false")]
    return settings


@dataclass(frozen=True)
class Identity:
    """Who a commit is by: the repository's own ``user.name`` and ``user.email``."""

    name: str
    email: str


@dataclass(frozen=True)
class HostGit:
    """git for one workspace (its root must be the repository's top)."""

    workspace: Path

    def run(
        self,
        *args: str,
        literal_paths: bool = False,
        index_file: Path | None = None,
        identity: Identity | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``git args`` with every safety setting and every driver neutralized.
        ``index_file``: an index of corral's own instead of the user's (``GIT_INDEX_FILE``);
        ``identity``: the author and committer of a commit or a reflog entry."""
        root = self.workspace.resolve()
        listed = _run(root, _SAFE_CONFIG, ["config", "--list", "-z"])
        if listed.returncode != 0:
            raise HostGitError(listed.stderr.strip()[:300] or "git config failed")
        names = driver_names(listed.stdout)
        if len(names) > MAX_DRIVERS:
            raise HostGitError(f"the repository's config defines {len(names)} filter drivers; refusing to run git")
        settings = [*_SAFE_CONFIG, *neutralizing_settings(names)]
        top = _run(root, settings, ["rev-parse", "--show-toplevel"])
        if top.returncode != 0:
            raise HostGitError(top.stderr.strip()[:300] or "not a git repository")
        if Path(top.stdout.strip()).resolve() != root:
            # core.worktree can send git anywhere (`/`, the user's home): status and
            # diff would list and show files outside the workspace.
            raise HostGitError(f"the repository's work tree is {top.stdout.strip()[:200]}, not the workspace {root}")
        prefix = ["--literal-pathspecs"] if literal_paths else []
        extra: dict[str, str] = {}
        if index_file is not None:
            extra["GIT_INDEX_FILE"] = str(index_file)
        if identity is not None:
            for who in ("AUTHOR", "COMMITTER"):
                extra[f"GIT_{who}_NAME"], extra[f"GIT_{who}_EMAIL"] = identity.name, identity.email
        return _run(root, settings, [*prefix, *args], extra)


# -- secrets out of status and diff --------------------------------------------------------


@dataclass(frozen=True)
class SecretPaths:
    """Which paths of a workspace are never shown (names relative to it, as git prints them)."""

    workspace: Path
    homes: tuple[Path, ...] = ()

    def hidden(self, names: Sequence[str]) -> set[str]:
        root = self.workspace.resolve()
        homes = [home.resolve() for home in self.homes]
        found = {name for name in names if self._by_name(name) or self._in_home(root, name, homes)}
        linked = [name for name in names if name not in found and _has_other_names(root / name)]
        if linked:
            # Another name (a hard link) of a secret file holds the same bytes. Rare, so
            # the walk that finds secret inodes is paid only then.
            secret_inodes = scan_controls(root).secret_inodes
            for name in linked:
                info = _lstat(root / name)
                if info is not None and (info.st_dev, info.st_ino) in secret_inodes:
                    found.add(name)
        return found

    @staticmethod
    def _by_name(name: str) -> bool:
        parts = PurePosixPath(name.rstrip("/")).parts
        return (refusal(parts) is not None or any(_DATABASE_RE.match(part.lower()) for part in parts)
                or secret_named(parts))

    @staticmethod
    def _in_home(root: Path, name: str, homes: Sequence[Path]) -> bool:
        path = root / name
        return any(path == home or home in path.parents or path in home.parents for home in homes)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except OSError:
        return None


def _has_other_names(path: Path) -> bool:
    info = _lstat(path)
    return info is not None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def quote_path(name: str) -> str:
    """A path as one line (git's own quoting is off with -z)."""
    if name.isprintable() and '"' not in name and "\\" not in name:
        return name
    return '"' + name.encode("unicode_escape", errors="backslashreplace").decode("ascii").replace('"', '\\"') + '"'


def status_lines(porcelain_z: str, hide: Mapping[str, bool]) -> str:
    """``git status --porcelain=v1 -z --branch --no-renames`` as lines, without the
    entries ``hide`` marks."""
    lines = []
    for entry in porcelain_z.split("\0"):
        if not entry:
            continue
        if entry.startswith("## "):
            lines.append(entry)
            continue
        code, name = entry[:2], entry[3:]
        if not hide.get(name, True):
            lines.append(f"{code} {quote_path(name)}")
    return "\n".join(lines) + ("\n" if lines else "")


def status_names(porcelain_z: str) -> list[str]:
    return [entry[3:] for entry in porcelain_z.split("\0") if entry and not entry.startswith("## ")]


def exclusions(hidden: set[str]) -> list[str]:
    """Pathspecs that leave ``hidden`` out of a diff (literal: no glob in a name counts)."""
    if len(hidden) > MAX_EXCLUDED:
        raise HostGitError(f"{len(hidden)} secret files changed; too many to leave out of a diff safely")
    return [f":(exclude,literal){name}" for name in sorted(hidden)]
