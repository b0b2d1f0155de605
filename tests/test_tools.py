"""fs.* and effect.record, called directly: confinement, patch guards, counters."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.effect import EffectRecord, read_effects
from corral.actors.tools.fs import FsList, FsPatch, FsRead, FsWrite
from corral.actors.tools.paths import scopes_overlap


def ctx(tmp_path: Path, scopes: tuple[str, ...] = (".",)) -> ToolContext:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return ToolContext("a", "run-1", "act-1", ws, scopes, tmp_path, effects_file=tmp_path / "fx.log")


async def test_write_read_patch_roundtrip_with_the_sha_guard(tmp_path: Path) -> None:
    c = ctx(tmp_path)
    await FsWrite().run(c, {"path": "notes/a.md", "content": "hello world"})
    read = await FsRead().run(c, {"path": "notes/a.md"})
    assert read.output["content"] == "hello world"
    sha = read.output["sha256"]
    assert sha == hashlib.sha256(b"hello world").hexdigest()
    patched = await FsPatch().run(c, {"path": "notes/a.md", "old_text": "world", "new_text": "corral",
                                      "expected_sha256": sha})
    assert (c.workspace / "notes" / "a.md").read_text() == "hello corral"
    with pytest.raises(ToolError, match="changed since it was read"):
        await FsPatch().run(c, {"path": "notes/a.md", "old_text": "hello", "new_text": "bye",
                                "expected_sha256": sha})
    with pytest.raises(ToolError, match="occurs 0 times"):
        await FsPatch().run(c, {"path": "notes/a.md", "old_text": "absent", "new_text": "x",
                                "expected_sha256": patched.output["sha256"]})
    listing = await FsList().run(c, {"path": "notes"})
    assert listing.output["entries"] == ["a.md"]
    assert "hello" not in patched.summary and "corral" not in patched.summary


@pytest.mark.parametrize(
    ("path", "message"),
    [("../x", "'..'"), ("/etc/passwd", "relative"), ("~/x", "relative"), (".corral/ledger.db", "control"),
     ("a/.corral/x", "control"), (".env", "secrets"), ("cfg/.env.prod", "secrets"), ("keys/id_ed25519", "secrets"),
     ("tls/server.pem", "secrets"), ("", "non-empty")],
)
async def test_path_attacks_are_refused_before_touching_anything(tmp_path: Path, path: str, message: str) -> None:
    c = ctx(tmp_path)
    with pytest.raises(ToolError, match=message):
        await FsWrite().run(c, {"path": path, "content": "x"})
    assert list(c.workspace.iterdir()) == []


async def test_symlinks_cannot_escape_or_reach_the_control_directory(tmp_path: Path) -> None:
    c = ctx(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (c.workspace / "out").symlink_to(outside)
    (c.workspace / ".corral").mkdir()
    (c.workspace / "ctl").symlink_to(c.workspace / ".corral")
    with pytest.raises(ToolError, match="escapes the workspace"):
        await FsWrite().run(c, {"path": "out/x", "content": "x"})
    with pytest.raises(ToolError, match="control directory"):
        await FsWrite().run(c, {"path": "ctl/x", "content": "x"})
    with pytest.raises(ToolError, match="escapes"):
        await FsRead().run(c, {"path": "out"})
    assert list(outside.iterdir()) == [] and list((c.workspace / ".corral").iterdir()) == []


async def test_writes_are_confined_to_write_scopes(tmp_path: Path) -> None:
    c = ctx(tmp_path, scopes=("docs",))
    await FsWrite().run(c, {"path": "docs/ok.md", "content": "x"})
    with pytest.raises(ToolError, match="outside this agent's write scopes"):
        await FsWrite().run(c, {"path": "src/no.py", "content": "x"})
    with pytest.raises(ToolError, match="outside"):
        await FsWrite().run(c, {"path": "docsx/no.md", "content": "x"})
    assert not (c.workspace / "src").exists()


def test_scope_overlap() -> None:
    assert scopes_overlap("a", "a/b") and scopes_overlap("a/b/", "a") and scopes_overlap(".", "x")
    assert not scopes_overlap("a", "ab") and not scopes_overlap("draft/intro", "draft/body")


async def test_effect_record_appends_exactly_one_line_per_call(tmp_path: Path) -> None:
    c = ctx(tmp_path)
    await EffectRecord().run(c, {"label": "one"})
    await EffectRecord().run(c, {"label": "two"})
    lines = read_effects(tmp_path / "fx.log")
    assert [line["label"] for line in lines] == ["one", "two"]
    assert all(line["action_id"] == "act-1" for line in lines)


async def test_a_parent_directory_made_meanwhile_by_another_writer_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two isolated children writing draft/intro/... and draft/body/... at once: one
    of them finds ``draft`` missing, and the other makes it before its mkdir."""
    import os

    real_mkdir = os.mkdir

    def raced(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)  # the other writer, first
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(os, "mkdir", raced)
    context = ctx(tmp_path)
    result = await FsWrite().run(context, {"path": "draft/intro/intro.md", "content": "# Draft\n"})
    assert result.ok
    assert (context.workspace / "draft" / "intro" / "intro.md").read_text() == "# Draft\n"
