"""The bubblewrap profile that commands and process sessions run under.

The profile is pure data and :func:`build_bwrap_argv` is a pure function of it, so a
reviewer can read the exact sandbox off a receipt and tests can assert it without
running anything. Whether a launch is sandboxed at all is decided by
:func:`resolve_launch_mode`, which fails closed: only an explicit
``allow-unsandboxed`` in the swarm spec ever lets a command run without bubblewrap.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.sandbox.control_paths import ControlPathError, SandboxEntries, sandbox_entries
from corral.sandbox.git_shapes import is_dotgit

#: Host directories every sandbox sees read-only (when they exist on this host).
SYSTEM_RO_DIRS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")

#: The only entries of /etc a sandbox sees (read-only): what programs need to run,
#: resolve names and verify TLS. An allow list, not a deny list: the sandbox runs as
#: the invoking uid, and when that is root the owner bits alone would let it read
#: password hashes and their backups (shadow-, gshadow-), sudoers, ssh host keys...
ETC_ALLOW: tuple[str, ...] = (
    "passwd", "group", "hosts", "hostname", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "ssl", "ca-certificates",
    "ca-certificates.conf", "pki", "alternatives", "os-release", "debian_version", "lsb-release", "mime.types",
    "protocols", "services", "networks", "shells", "bash.bashrc", "profile", "profile.d",
    "inputrc", "terminfo", "locale.alias", "locale.conf", "default", "magic", "magic.mime", "gitconfig",
    "python3", "mtab",
)  # fmt: skip

#: Inside allowed /etc directories, entries emptied again: TLS private keys (a
#: root sandbox could read them through the bind of /etc/ssl).
ETC_EMPTIED: tuple[str, ...] = ("/etc/ssl/private", "/etc/pki/tls/private")

#: The private HOME inside the sandbox (a tmpfs, gone when the sandbox ends).
SANDBOX_HOME = "/home/sandbox"
SANDBOX_TMP = "/tmp"
SANDBOX_HOSTNAME = "corral-sandbox"

#: Where bubblewrap may come from (seed 004 V1.11: "bubblewrap 只允许从固定系统候选路径解析"):
#: the distribution's paths, never the supervisor's PATH (which may start with a
#: user-writable directory: ~/.cargo/bin, a pyenv shim...).
BWRAP_CANDIDATES: tuple[str, ...] = ("/usr/bin/bwrap", "/bin/bwrap")

#: Entries of the project root bound read-only at their own path when they exist
#: (seed 004 V1.11: ".git / .agents / .codex / .hermes 存在时按原路径只读挂载"): git's
#: control directory, and the directories an agent runtime reads as start-up context
#: (corral reads project skills from .codex/skills and .agents/skills:
#: actors/repo_skills.py), so a command cannot plant instructions for the next run.
PROTECTED_ROOT_DIRS: tuple[str, ...] = (".git", ".agents", ".codex", ".hermes")


class SandboxError(RuntimeError):
    """Base class; ``code`` is stable and machine-readable."""

    code = "sandbox-error"


class SandboxUnavailable(SandboxError):
    """The spec requires the sandbox and bubblewrap is missing or does not work."""

    code = "sandbox-unavailable"


class SandboxProfileError(SandboxError, ValueError):
    """A profile that would not isolate what it claims to (bad input, nothing launched)."""

    code = "bad-sandbox-profile"


class SandboxMode(enum.StrEnum):
    """What the swarm spec allows."""

    REQUIRED = "required"
    ALLOW_UNSANDBOXED = "allow-unsandboxed"

    @classmethod
    def parse(cls, value: str) -> SandboxMode:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise SandboxProfileError(
                f"unknown sandbox mode {value!r} (expected one of: {allowed})"
            ) from None


class LaunchMode(enum.StrEnum):
    """How one launch actually ran; recorded on every receipt."""

    SANDBOXED = "sandboxed"
    UNSANDBOXED = "unsandboxed"


@dataclass(frozen=True)
class Rlimits:
    """Resource limits applied inside the sandbox (soft and hard); None = inherit."""

    cpu_s: int | None = None
    address_space_bytes: int | None = None
    open_files: int | None = None
    processes: int | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_s", "address_space_bytes", "open_files", "processes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise SandboxProfileError(f"rlimit {name} must be a positive integer, got {value!r}")

    def as_dict(self) -> dict[str, int]:
        items = {
            "cpu_s": self.cpu_s,
            "address_space_bytes": self.address_space_bytes,
            "open_files": self.open_files,
            "processes": self.processes,
        }
        return {name: value for name, value in items.items() if value is not None}


@dataclass(frozen=True)
class SandboxProfile:
    """What one sandboxed launch may see and do.

    ``project_root`` is bound at the same path (read-write unless ``rw`` is false),
    each name in ``hide`` is covered by an empty read-only tmpfs, each name in
    ``ro_subdirs`` is re-bound read-only. ``extra_ro`` are further host paths made
    visible read-only (the launcher adds the interpreter that runs the trampoline).
    """

    project_root: Path
    rw: bool = True
    hide: tuple[str, ...] = (".corral",)
    ro_subdirs: tuple[str, ...] = PROTECTED_ROOT_DIRS
    #: Absolute directories never visible inside, whatever their name or place: corral's
    #: home (the ledger, the endpoint file with its token, the sockets, the logs),
    #: in the project or in any other tree the sandbox sees (the virtualenv, /usr...).
    masked: tuple[Path, ...] = ()
    #: Absolute paths in the project re-bound read-only, beyond the deny list: the git
    #: control entries at launch and every other name (hard link) of a file in one
    #: (sandbox/tree_guard.py; the launch handshake fills this in).
    read_only: tuple[Path, ...] = ()
    #: When set, the project root is bound read-only and only these absolute paths in
    #: it are bound read-write over it (an intent contract's path scope,
    #: supervisor/intent/intent_scope.py); the read-only binds and masks still cover them.
    writable: tuple[Path, ...] | None = None
    network: bool = False
    rlimits: Rlimits | None = None
    mode: SandboxMode = SandboxMode.REQUIRED
    extra_ro: tuple[Path, ...] = field(default=())
    bwrap: str | None = None
    #: A directory of the launcher's own that the sandbox never sees, for what the
    #: launcher keeps about a launch while its command runs (the tree guard's record:
    #: sandbox/guard_record.py). None: see private_dir.
    state_dir: Path | None = None
    #: The deny list's entries of the project (control_paths.sandbox_entries), when the
    #: launcher already walked it: the launch handshake walks the tree once for these
    #: and the tree guard's snapshot. None: build_bwrap_argv walks the project itself.
    entries: SandboxEntries | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        root = Path(self.project_root)
        if not root.is_absolute():
            raise SandboxProfileError(f"project root must be absolute: {root}")
        # Resolving once here means every later check and bind uses the real path, so a
        # symlinked root cannot point the sandbox somewhere the checks did not look.
        resolved = root.resolve()
        if not resolved.is_dir():
            raise SandboxProfileError(f"project root is not a directory: {root}")
        if resolved == Path("/"):
            raise SandboxProfileError("project root must not be /")
        object.__setattr__(self, "project_root", resolved)
        for name in (*self.hide, *self.ro_subdirs):
            if not name or "/" in name or name in (".", ".."):
                raise SandboxProfileError(f"hidden/read-only entries are plain names: {name!r}")
        extra = tuple(Path(p) for p in self.extra_ro)
        for path in extra:
            if not path.is_absolute():
                raise SandboxProfileError(f"extra read-only path must be absolute: {path}")
        object.__setattr__(self, "extra_ro", extra)
        masked = tuple(Path(p) for p in self.masked)
        for path in masked:
            if not path.is_absolute():
                raise SandboxProfileError(f"masked path must be absolute: {path}")
        object.__setattr__(self, "masked", masked)
        read_only = tuple(Path(p) for p in self.read_only)
        for path in read_only:
            if not path.is_absolute():
                raise SandboxProfileError(f"read-only path must be absolute: {path}")
        object.__setattr__(self, "read_only", read_only)
        if self.state_dir is not None:
            if not Path(self.state_dir).is_absolute():
                raise SandboxProfileError(f"state directory must be absolute: {self.state_dir}")
            object.__setattr__(self, "state_dir", Path(self.state_dir))

    def private_dir(self) -> Path | None:
        """Where the launcher may keep what the command inside must never see or
        change: ``state_dir``, else the first masked directory that is the caller's own
        and private (mode 0700): corral's home, which the supervisor masks first
        (supervisor/sessions/session_service.py) and keeps 0700 (supervisor/home/home_dir.py). None when
        there is no such place. Whether it is really hidden inside: hidden_inside."""
        if self.state_dir is not None:
            return self.state_dir
        for path in self.masked:
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700:
                return path.resolve()
        return None

    def hidden_inside(self, path: Path) -> bool:
        """Whether the sandbox can never see ``path``: it lies in a masked directory,
        or in no tree the sandbox binds (judged after resolving symlinks)."""
        real = path.resolve()
        if any(_is_under(real, masked.resolve()) for masked in self.masked if masked.resolve().is_dir()):
            return True
        return not any(_is_under(real, tree) for tree in _visible_trees(self))

    def with_entries(self, entries: SandboxEntries) -> SandboxProfile:
        return dataclasses.replace(self, entries=entries)

    def with_extra_ro(self, paths: Sequence[Path]) -> SandboxProfile:
        return dataclasses.replace(self, extra_ro=tuple(dict.fromkeys((*self.extra_ro, *paths))))

    def with_read_only(self, paths: Sequence[Path]) -> SandboxProfile:
        return dataclasses.replace(self, read_only=tuple(dict.fromkeys((*self.read_only, *paths))))


def untrusted_reason(path: str) -> str | None:
    """Why ``path`` may not be run as bubblewrap, or None when it may: it must resolve
    to a regular executable file owned by root that no one but root can write (seed
    004 V1.11: "文件必须是普通可执行文件且不能被当前普通用户写入"). Owned by another user, a
    file is that user's to swap for anything."""
    try:
        real = os.path.realpath(path)
        info = os.stat(real)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file"
    if not info.st_mode & stat.S_IXUSR or not os.access(real, os.X_OK):
        return f"{path} is not executable"
    if info.st_uid != 0:
        return f"{path} is not owned by root (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or by everyone (mode {stat.S_IMODE(info.st_mode):o})"
    if os.geteuid() != 0 and os.access(real, os.W_OK):
        return f"{path} is writable by the current user"
    return None


def find_bwrap(executable: str | None = None) -> str | None:
    """The first trusted bubblewrap among :data:`BWRAP_CANDIDATES` (or ``executable``
    alone, a path a test names, held to the same checks), or None: never a lookup on
    PATH."""
    for candidate in (executable,) if executable else BWRAP_CANDIDATES:
        if os.path.isabs(candidate) and untrusted_reason(candidate) is None:
            return candidate
    return None


#: Every namespace new, and no nested user namespace inside (seed 004 V1.11: "禁用嵌套
#: user namespace": a user namespace of its own would give the command every
#: capability again in it). ``--disable-userns`` needs an explicit ``--unshare-user``
#: and bubblewrap 0.8.0 or later; an older one fails the probe below: unavailable.
NAMESPACE_FLAGS: tuple[str, ...] = ("--unshare-all", "--unshare-user", "--disable-userns")


@functools.cache
def _probe(path: str) -> bool:
    # A binary that exists but cannot create namespaces (user namespaces disabled, a
    # seccomp'd container) is as good as missing: find out once, with the same
    # namespace flags every real launch uses.
    try:
        result = subprocess.run(
            [path, *NAMESPACE_FLAGS, "--die-with-parent", "--ro-bind", "/", "/", "--", "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def bwrap_available(executable: str | None = None) -> bool:
    """True when bubblewrap is installed and can create the namespaces we need."""
    path = find_bwrap(executable)
    return path is not None and _probe(path)


def resolve_launch_mode(
    mode: SandboxMode | str, *, available: bool | None = None, executable: str | None = None
) -> LaunchMode:
    """Decide how to launch; raises :class:`SandboxUnavailable` rather than degrade.

    ``available`` overrides the probe (for callers that already know, and tests).
    """
    parsed = mode if isinstance(mode, SandboxMode) else SandboxMode.parse(mode)
    ok = bwrap_available(executable) if available is None else available
    if ok:
        return LaunchMode.SANDBOXED
    if parsed is SandboxMode.ALLOW_UNSANDBOXED:
        return LaunchMode.UNSANDBOXED
    raise SandboxUnavailable(
        "the swarm spec requires the sandbox and bubblewrap is not available "
        "(install it: apt-get install -y bubblewrap; or set sandbox = "
        '"allow-unsandboxed" in the spec to run commands without isolation)'
    )


def _is_under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _checked_entry(root: Path, name: str) -> Path | None:
    """The path of a hidden/read-only entry, or None when it does not exist."""
    path = root / name
    if path.is_symlink():
        # A bind or tmpfs on a symlink lands on its target, possibly outside the
        # project; refuse instead of protecting the wrong place.
        raise SandboxProfileError(f"{path} is a symlink; refusing to sandbox around it")
    if not path.exists():
        # bwrap would create the mount point on the host through the rw project bind,
        # leaving an empty directory in the user's tree.
        return None
    return path


def _protected_entry(root: Path, name: str) -> Path | None:
    """What to bind read-only for the root entry ``name``: the entry, or None when it
    does not exist. ``.codex -> .agents`` (one skill directory under two names) is
    protected at its target in the project; a target outside the project is not
    bound into the sandbox at all, so there is nothing to write. git's entry (and a
    link at the project itself) is refused as a symlink, as before."""
    path = root / name
    if not path.is_symlink() or is_dotgit(name):
        return _checked_entry(root, name)
    target = path.resolve()
    if target == root:
        raise SandboxProfileError(f"{path} is a symlink to the project root; refusing to sandbox around it")
    return target if _is_under(target, root) and target.exists() else None


def build_bwrap_argv(
    profile: SandboxProfile,
    target_argv: Sequence[str],
    cwd: Path,
    *,
    info_fd: int | None = None,
) -> list[str]:
    """The full bubblewrap command line (argv[0] is bwrap) that runs ``target_argv``.

    Order matters to bwrap: later mounts cover earlier ones, so the tmpfs /tmp comes
    before a project root under /tmp, and the read-only re-binds come last.
    """
    if not target_argv:
        raise SandboxProfileError("empty target argv")
    root = profile.project_root
    cwd = Path(cwd).resolve()
    if not _is_under(cwd, root):
        raise SandboxProfileError(f"cwd {cwd} is outside the project root {root}")
    executable = find_bwrap(profile.bwrap)
    if executable is None:
        # Never a bubblewrap found some other way (PATH, a relative name): fail closed.
        raise SandboxUnavailable(
            f"no trusted bubblewrap at {', '.join((profile.bwrap,) if profile.bwrap else BWRAP_CANDIDATES)}"
            " (a regular executable owned by root and writable by no one else; install it: apt-get install -y"
            " bubblewrap)"
        )

    argv = [executable, *NAMESPACE_FLAGS]
    if profile.network:
        argv.append("--share-net")
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--hostname", SANDBOX_HOSTNAME]

    for directory in SYSTEM_RO_DIRS:
        path = Path(directory)
        if path.is_symlink():
            # Merged-/usr hosts: recreate the link rather than binding its target twice.
            argv += ["--symlink", os.readlink(path), directory]
        elif path.is_dir():
            argv += ["--ro-bind", directory, directory]
    argv += ["--dir", "/etc"]
    for name in ETC_ALLOW:
        entry = Path("/etc") / name
        if entry.is_symlink():
            argv += ["--symlink", os.readlink(entry), str(entry)]
        elif entry.exists():
            argv += ["--ro-bind", str(entry), str(entry)]
    for private in ETC_EMPTIED:
        path = Path(private)
        if path.is_dir() and not path.is_symlink():
            argv += ["--tmpfs", private]

    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--tmpfs", SANDBOX_TMP, "--tmpfs", SANDBOX_HOME]

    argv += ["--bind" if profile.rw and profile.writable is None else "--ro-bind", str(root), str(root)]
    argv += _writable_binds(profile)

    system = tuple(Path(d) for d in SYSTEM_RO_DIRS)
    for extra in profile.extra_ro:
        real = extra.resolve()
        if any(_is_under(real, s) for s in system if not s.is_symlink()):
            continue
        if real.exists():
            # After the project bind, so a runtime inside the project is read-only too.
            argv += ["--ro-bind", str(real), str(real)]
    argv += _read_only_binds(profile)

    for name in profile.hide:
        hidden = _checked_entry(root, name)
        if hidden is not None:
            argv += ["--tmpfs", str(hidden), "--remount-ro", str(hidden)]
    for name in profile.ro_subdirs:
        protected = _protected_entry(root, name)
        if protected is not None:
            argv += ["--ro-bind", str(protected), str(protected)]
    argv += _control_mounts(profile)

    argv += ["--setenv", "HOME", SANDBOX_HOME, "--setenv", "TMPDIR", SANDBOX_TMP]
    argv += ["--chdir", str(cwd)]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    argv.append("--")
    argv += list(target_argv)
    return argv


def _writable_binds(profile: SandboxProfile) -> list[str]:
    """The scope's paths, read-write over the read-only root (before every read-only
    bind and mask, which still cover them). A symlink, a path gone or one outside the
    project is left read-only: fail closed."""
    root = profile.project_root
    argv: list[str] = []
    for path in profile.writable or ():
        if path.is_symlink() or not path.exists() or not _is_under(path.resolve(), root):
            continue
        argv += ["--bind", str(path), str(path)]
    return argv


def _read_only_binds(profile: SandboxProfile) -> list[str]:
    """Before the deny list's mounts, so a secret or hidden entry inside one of these
    is still masked over it."""
    root = profile.project_root
    argv: list[str] = []
    for path in profile.read_only:
        # A symlink (swapped in since the walk) would bind its target; a path gone or
        # outside the project has nothing to protect in it.
        if path.is_symlink() or not path.exists() or not _is_under(path.resolve(), root):
            continue
        argv += ["--ro-bind", str(path), str(path)]
    return argv


def _visible_trees(profile: SandboxProfile) -> list[Path]:
    """The host trees bound into the sandbox, resolved: where a home could be seen."""
    trees = [profile.project_root]
    for directory in (*SYSTEM_RO_DIRS, *(f"/etc/{name}" for name in ETC_ALLOW)):
        path = Path(directory)
        if path.exists():
            trees.append(path.resolve())
    trees += [extra.resolve() for extra in profile.extra_ro]
    return trees


def _control_mounts(profile: SandboxProfile) -> list[str]:
    """The one deny list (corral.sandbox.control_paths) at any depth of the project,
    then the masked directories (the home), wherever the sandbox would see them."""
    root = profile.project_root
    try:
        read_only, hidden, secrets = profile.entries if profile.entries is not None else sandbox_entries(root)
    except ControlPathError as exc:
        raise SandboxProfileError(str(exc)) from None
    argv: list[str] = []
    for path in hidden:
        argv += ["--tmpfs", str(path), "--remount-ro", str(path)]
    for path in read_only:
        argv += ["--ro-bind", str(path), str(path)]
    for path in secrets:
        # The data never gets in: a redactor matching output could not win against
        # `base64 .env` or `rev .env`.
        if path.is_dir():
            argv += ["--tmpfs", str(path), "--remount-ro", str(path)]
        else:
            argv += ["--ro-bind", "/dev/null", str(path)]
    visible = _visible_trees(profile)
    for masked in profile.masked:
        real = masked.resolve()
        # Wherever it lies in a tree the sandbox sees (the project, the virtualenv, the
        # corral package, /usr/local/share...): an empty read-only tmpfs over it. Last,
        # so it covers every bind of its tree.
        if real.is_dir() and any(_is_under(real, tree) for tree in visible):
            argv += ["--tmpfs", str(real), "--remount-ro", str(real)]
        elif real.is_file() and _is_under(real, root):
            argv += ["--ro-bind", "/dev/null", str(real)]  # a masked file (a scope's exclusion): bound empty
    return argv
