"""Packaged models: a model split over several distributions is assembled once,
checked against its pinned sha256, and refused when it does not match."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from corral.supervisor.models.model_spec import check_gguf
from corral.supervisor.models.packaged_models import PACKAGED, QWEN_CODER, assembled_file, packaged_model_file
from corral.supervisor.spec.spec_base import SpecError


def _parts(tmp_path: Path, chunks: list[bytes]) -> list[Path]:
    paths = []
    for n, chunk in enumerate(chunks):
        path = tmp_path / f"part{n}.bin"
        path.write_bytes(chunk)
        paths.append(path)
    return paths


def test_parts_are_assembled_in_order_and_verified(tmp_path: Path) -> None:
    parts = _parts(tmp_path, [b"GGUF", b"-one", b"-two"])
    pinned = hashlib.sha256(b"GGUF-one-two").hexdigest()
    target = assembled_file(parts, tmp_path / "cache", "m.gguf", pinned)
    assert target.read_bytes() == b"GGUF-one-two"
    assert check_gguf(target) == target
    # The stamp names the hash and the file as it is now; a second call keeps the file.
    inode = target.stat().st_ino
    assert assembled_file(parts, tmp_path / "cache", "m.gguf", pinned).stat().st_ino == inode
    assert (tmp_path / "cache" / "m.gguf.sha256").read_text().startswith(pinned)


def test_parts_that_do_not_hash_to_the_pin_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    parts = _parts(tmp_path, [b"GGUF", b"-tampered"])
    pinned = hashlib.sha256(b"GGUF-original").hexdigest()
    with pytest.raises(SpecError, match="refusing to load it"):
        assembled_file(parts, tmp_path / "cache", "m.gguf", pinned)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m.gguf.lock"]


def test_a_changed_assembled_file_is_assembled_again(tmp_path: Path) -> None:
    parts = _parts(tmp_path, [b"GGUF", b"-one"])
    pinned = hashlib.sha256(b"GGUF-one").hexdigest()
    target = assembled_file(parts, tmp_path / "cache", "m.gguf", pinned)
    target.write_bytes(b"GGUF-evil")  # same size would not matter: the stamp holds the mtime too
    os.utime(target, ns=(1, 1))
    again = assembled_file(parts, tmp_path / "cache", "m.gguf", pinned)
    assert again.read_bytes() == b"GGUF-one"


def test_the_packaged_qwen_model_assembles_to_its_pinned_hash() -> None:
    """The real six data wheels (installed by the local extra), in the user's cache
    where the demo and examples/local_model.py find it (assembled here if it is not
    there yet: the assembly itself is tested above, without writing 491 MB again)."""
    path = packaged_model_file(QWEN_CODER.name)
    assert check_gguf(path) == path
    assert path.stat().st_size == 491_400_064
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == QWEN_CODER.sha256
    assert set(PACKAGED) == {"smollm2", "qwen2.5-coder-0.5b"}
