"""User code loaded by file path, under a private package name, pinned by content hash.

Why: a host-side corral process (supervisor, fork server, actors) must never have
the project, the spec's directory or the working directory on its import path. The
model can write files in the project, and a cloned repository ships whatever it
likes: a ``yaml.py`` next to the spec would otherwise be imported by the supervisor
the first time it parses a skill's front matter, outside the sandbox, with the
control token and the ledger in reach (issue 48 A.1).

So user modules are never found through ``sys.path``. A *root* is a directory the
user named (the spec's own directory, or an entry of ``PYTHONPATH`` given at
``corral up``). A module ``pkg.tools`` found under root ``R`` is imported as
``corral_user_<hash of R>.pkg.tools``, by this finder alone: the standard path finder
never sees the private names, and nothing a root holds can shadow ``yaml`` or
``corral``. Relative imports inside the user's packages work as usual.

At ``corral up`` the finder *records*: each user file it executes is hashed from the
very bytes it compiles. The supervisor then freezes the record and hands it to the
fork server and every actor (``USER_CODE_ENV``). Those *enforce* it: a pinned file
whose bytes changed since ``up``, or a user module that ``up`` never loaded, is
refused with an error that says so. It is never imported again silently, whether by
a fork-server replacement, an actor's restart or a new agent.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from corral.core.errors import UserCodeError

#: The prefix of every private package name (one per root).
PRIVATE_PREFIX = "corral_user_"

#: The environment variable carrying the frozen record to the fork server and actors.
USER_CODE_ENV = "CORRAL_USER_CODE"

#: A user module larger than this is refused rather than hashed and compiled.
MAX_MODULE_BYTES = 8 * 1024 * 1024


class UserCodeChanged(UserCodeError, ImportError):
    """A pinned user module's file no longer holds the bytes pinned at ``corral up``."""


class UserCodeNotPinned(UserCodeError, ImportError):
    """A user module that ``corral up`` never loaded, asked for afterwards."""


def root_package(root: Path) -> str:
    """The private package name of one root directory."""
    return PRIVATE_PREFIX + hashlib.sha256(str(root).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Pin:
    """One user module as ``corral up`` loaded it: its file, the sha256 of the bytes
    that ran, and whether it is a package. A namespace package (a directory with no
    ``__init__.py``) and a root have no file: ``sha256`` is empty."""

    path: str
    sha256: str
    package: bool


@dataclass
class UserCodeRecord:
    """The roots, in search order, and the pins: what the supervisor hands on."""

    roots: list[tuple[str, str]] = field(default_factory=list)  # (private package, directory)
    #: Pins by module name: private names for modules found by name in a root, and
    #: public names for modules a user module imported from a root by ``sys.path``.
    pins: dict[str, Pin] = field(default_factory=dict)
    #: The roots given on ``PYTHONPATH``: only their distributions may register
    #: entry points (a ``*.dist-info`` in the project registers nothing).
    plugin_roots: list[str] = field(default_factory=list)

    def copy(self) -> UserCodeRecord:
        return UserCodeRecord(list(self.roots), dict(self.pins), list(self.plugin_roots))

    def to_json(self) -> str:
        return json.dumps({
            "roots": [list(root) for root in self.roots],
            "pins": {name: [pin.path, pin.sha256, pin.package] for name, pin in self.pins.items()},
            "plugin_roots": self.plugin_roots,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> UserCodeRecord:
        data = json.loads(text)
        return cls(
            roots=[(str(name), str(directory)) for name, directory in data["roots"]],
            pins={str(name): Pin(str(path), str(digest), bool(package))
                  for name, (path, digest, package) in data["pins"].items()},
            plugin_roots=[str(directory) for directory in data.get("plugin_roots", [])],
        )


def _read(path: str) -> bytes:
    """A user module's bytes: a regular file, bounded, opened without following a
    symlink swapped in after the path was resolved."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        import stat

        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserCodeError(f"user module {path} is not a regular file")
        if info.st_size > MAX_MODULE_BYTES:
            raise UserCodeError(f"user module {path} is {info.st_size} bytes, more than {MAX_MODULE_BYTES}")
        return handle.read(MAX_MODULE_BYTES + 1)


class _PinnedLoader(importlib.abc.Loader):
    """Executes one user module from bytes whose hash is the pinned one."""

    def __init__(self, finder: UserCodeFinder, fullname: str, pin: Pin, source: bytes | None) -> None:
        self.finder = finder
        self.fullname = fullname
        self.pin = pin
        self.source = source  # the bytes discovery hashed (recording), or None: read them now

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        if not self.pin.sha256:
            return  # a root or a namespace package: nothing to run
        data = self.source if self.source is not None else _read(self.pin.path)
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.pin.sha256:
            raise UserCodeChanged(
                f"user module {self.finder.public_name(self.fullname)!r} ({self.pin.path}) changed after"
                f" `corral up` (sha256 {self.pin.sha256[:12]} then, {digest[:12]} now); corral never runs user"
                " code edited since `up` (the model can write in the project): review the change and run"
                " `corral up` again"
            )
        code = compile(data, self.pin.path, "exec", dont_inherit=True)
        # User code that puts its own directory on sys.path (a common idiom) must not
        # leave it there: every later lazy import of the host would resolve there first.
        saved = list(sys.path)
        try:
            exec(code, module.__dict__)
        finally:
            if sys.path != saved:
                sys.path[:] = saved


class UserCodeFinder(importlib.abc.MetaPathFinder):
    """The one importer of user modules in a process (installed first on
    ``sys.meta_path``). It answers for the private names only, and raises rather than
    letting another finder try them."""

    def __init__(self, record: UserCodeRecord, *, recording: bool) -> None:
        self.record = record
        self.recording = recording

    # -- roots and names ---------------------------------------------------------

    def add_roots(self, directories: Iterable[Path], *, plugins: bool = False) -> None:
        """Search ``directories`` too (after the roots already known), while recording;
        ``plugins``: their distributions may register entry points (``PYTHONPATH``'s)."""
        if not self.recording:
            return  # the roots were fixed at `corral up`
        known = {directory for _, directory in self.record.roots}
        for directory in directories:
            real = os.path.realpath(directory)
            if not os.path.isdir(real):
                continue
            if real not in known:
                self.record.roots.append((root_package(Path(real)), real))
                known.add(real)
            if plugins and real not in self.record.plugin_roots:
                self.record.plugin_roots.append(real)

    def private_name(self, dotted: str) -> str | None:
        """The private name of user module ``dotted`` in the first root that has it,
        or None (then it is an installed module, imported the ordinary way). An
        installed package wins over a root: the project cannot shadow one."""
        if self.recording and self._installed(dotted.partition(".")[0]):
            return None
        for package, directory in self.record.roots:
            fullname = f"{package}.{dotted}"
            if fullname in self.record.pins or fullname in sys.modules:
                return fullname
            if self.recording and self._locate(Path(directory), dotted.split(".")) is not None:
                return fullname
        return None

    def public_name(self, fullname: str) -> str:
        """The name the user wrote, for messages."""
        return fullname.partition(".")[2] or fullname

    def file_module(self, path: Path) -> str:
        """The private name of the ``.py`` file ``path``: its package is found by
        walking up through directories that hold ``__init__.py`` (as pytest does),
        and the first directory above them becomes a root."""
        real = Path(os.path.realpath(path))
        # Under a known root (the spec's directory), its place there names it: an
        # `__init__.py` written beside the spec later cannot move it elsewhere.
        for package, root in sorted(self.record.roots, key=lambda item: -len(item[1])):
            if real.is_relative_to(root) and real.suffix == ".py":
                relative = real.relative_to(root).with_suffix("").parts
                parts_in_root = list(relative[:-1] if relative[-1] == "__init__" else relative)
                if parts_in_root and all(part.isidentifier() for part in parts_in_root):
                    return f"{package}.{'.'.join(parts_in_root)}"
        parts = [real.stem] if real.name != "__init__.py" else []
        directory = real.parent
        while (directory / "__init__.py").is_file() and directory.parent != directory:
            parts.insert(0, directory.name)
            directory = directory.parent
        if not parts:
            raise UserCodeError(f"{path} is a package's __init__.py at the file system's root")
        for package, root in self.record.roots:
            if root == str(directory):
                return f"{package}.{'.'.join(parts)}"
        if not self.recording:
            raise UserCodeError(f"user module {path} lies in no directory pinned at `corral up`")
        self.record.roots.append((root_package(directory), str(directory)))
        return f"{root_package(directory)}.{'.'.join(parts)}"

    def export(self) -> UserCodeRecord:
        """A copy of the record (the supervisor freezes it after the spec is loaded)."""
        return self.record.copy()

    # -- the import protocol -----------------------------------------------------

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PRIVATE_PREFIX):
            return self._guard_public(fullname, path, target)
        pin = self.record.pins.get(fullname)
        source = None
        if pin is None:
            if not self.recording:
                raise UserCodeNotPinned(
                    f"user module {self.public_name(fullname)!r} was not loaded at `corral up`, so it is not"
                    " pinned; corral loads only the user code `up` loaded (import it at the top of your"
                    " tools, actor or provider module, and run `corral up` again)"
                )
            found = self._discover(fullname)
            if found is None:
                raise ModuleNotFoundError(f"no module named {self.public_name(fullname)!r}", name=fullname)
            pin, source = found
            self.record.pins[fullname] = pin
        spec = importlib.machinery.ModuleSpec(
            fullname, _PinnedLoader(self, fullname, pin, source), origin=pin.path if pin.sha256 else None,
            is_package=pin.package,
        )
        if pin.package:
            spec.submodule_search_locations = [pin.path if not pin.sha256 else str(Path(pin.path).parent)]
        spec.has_location = bool(pin.sha256)
        return spec

    def _guard_public(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        """A module imported by its plain name whose file lies in a root: a user module
        that put its own directory on ``sys.path`` and imports a sibling (a common
        idiom). It is pinned like any user module (recording) or refused unless pinned
        (enforcing); anything else is left to the ordinary finders."""
        if not self.record.roots:
            return None
        found = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if found is None:
            return None
        location = found.origin if found.has_location and found.origin else next(
            iter(found.submodule_search_locations or ()), None)
        if location is None or not self._in_a_root(os.path.realpath(location)):
            return None
        real = os.path.realpath(location)
        package = found.submodule_search_locations is not None
        pin = self.record.pins.get(fullname)
        source = None
        if pin is None or pin.path != real:
            if not self.recording:
                raise UserCodeNotPinned(
                    f"user module {fullname!r} ({real}) was not loaded at `corral up`, so it is not pinned;"
                    " corral loads only the user code `up` loaded (run `corral up` again to take it)"
                )
            if os.path.isdir(real):
                pin = Pin(real, "", True)
            else:
                source = _read(real)
                pin = Pin(real, hashlib.sha256(source).hexdigest(), package)
            self.record.pins[fullname] = pin
        spec = importlib.machinery.ModuleSpec(
            fullname, _PinnedLoader(self, fullname, pin, source), origin=pin.path if pin.sha256 else None,
            is_package=pin.package,
        )
        if pin.package:
            spec.submodule_search_locations = [pin.path if not pin.sha256 else str(Path(pin.path).parent)]
        spec.has_location = bool(pin.sha256)
        return spec

    def _in_a_root(self, real: str) -> bool:
        return any(real.startswith(root + os.sep) for _, root in self.record.roots) and not _installed_path(real)

    def _installed(self, top: str) -> bool:
        """Whether ``top`` is an installed (or corral's own) top-level module."""
        if top in sys.modules:
            return not top.startswith(PRIVATE_PREFIX)
        found = importlib.machinery.PathFinder.find_spec(top)
        if found is None:
            return False
        location = found.origin if found.has_location and found.origin else next(
            iter(found.submodule_search_locations or ()), None)
        return location is not None and _installed_path(os.path.realpath(location))

    def _discover(self, fullname: str) -> tuple[Pin, bytes | None] | None:
        package, _, rest = fullname.partition(".")
        directory = dict(self.record.roots).get(package)
        if directory is None:
            return None
        if not rest:
            return Pin(directory, "", True), None
        located = self._locate(Path(directory), rest.split("."))
        if located is None:
            return None
        file, is_package = located
        if file.is_dir():
            return Pin(str(file), "", True), None
        data = _read(str(file))
        return Pin(str(file), hashlib.sha256(data).hexdigest(), is_package), data

    @staticmethod
    def _locate(root: Path, parts: list[str]) -> tuple[Path, bool] | None:
        """The file (or namespace directory) of ``parts`` under ``root``, resolved."""
        base = root.joinpath(*parts[:-1]) / parts[-1]
        for candidate, is_package in ((base / "__init__.py", True), (base.with_name(parts[-1] + ".py"), False)):
            if candidate.is_file():
                return Path(os.path.realpath(candidate)), is_package
        if base.is_dir():
            return Path(os.path.realpath(base)), True
        return None


@functools.cache
def _installed_prefixes() -> tuple[str, ...]:
    """Where installed code lives: the interpreter's prefixes, the site directories
    and corral's own source (an editable install's folders)."""
    import site

    import corral

    places = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), site.getusersitepackages()}
    places.add(str(Path(corral.__file__).parent))
    for name in ("corral.actors", "corral.supervisor", "corral.mailbox", "corral.sandbox"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            places.add(str(Path(str(module.__file__)).parent))
    return tuple(sorted({os.path.realpath(place) for place in places if place}))


def _installed_path(real: str) -> bool:
    return any(real == prefix or real.startswith(prefix + os.sep) for prefix in _installed_prefixes())


def installed_finder() -> UserCodeFinder | None:
    """This process's finder, if one is installed (the import system holds it)."""
    return next((finder for finder in sys.meta_path if isinstance(finder, UserCodeFinder)), None)


#: Modules the host imports lazily while it reads workspace content (a skill's front
#: matter): imported before any user code runs, so nothing user code does to the
#: import system can change what they are.
HOST_MODULES = ("yaml",)


def install(record: UserCodeRecord | None = None, *, recording: bool) -> UserCodeFinder:
    """Install the finder first on ``sys.meta_path``, or return the one installed
    (switched to ``recording``'s mode when a record is given: a supervisor booting
    from a stored record enforces it)."""
    finder = installed_finder()
    if finder is None:
        import importlib

        for name in HOST_MODULES:
            importlib.import_module(name)
        finder = UserCodeFinder(record or UserCodeRecord(), recording=recording)
        sys.meta_path.insert(0, finder)
    elif record is not None:
        finder.record = record
        finder.recording = recording
    return finder


def freeze() -> UserCodeRecord:
    """Stop recording: from now on this process enforces what it loaded."""
    finder = install(recording=False)
    finder.recording = False
    return finder.export()


@contextmanager
def enforcing(record: UserCodeRecord) -> Iterator[None]:
    """Enforce ``record`` in this process for a while (the CLI reading the spec a
    home's last boot ran: the user code `up` pinned, not what the files hold now)."""
    finder = install(recording=True)
    saved = (finder.record, finder.recording)
    finder.record, finder.recording = record.copy(), False
    try:
        yield
    finally:
        finder.record, finder.recording = saved


def install_from_env() -> UserCodeFinder:
    """In the fork server and every actor: enforce the record the supervisor froze."""
    text = os.environ.get(USER_CODE_ENV)
    record = UserCodeRecord.from_json(text) if text else UserCodeRecord()
    return install(record, recording=False)


def pythonpath_roots() -> list[Path]:
    """``PYTHONPATH`` as the user gave it to ``corral up``: directories searched for
    user modules (by file, pinned), never put on a host process's ``sys.path``."""
    from corral.core.child_python import user_path

    return [Path(part) for part in user_path()]
