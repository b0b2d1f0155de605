"""The disposable project and home the suite runs in: a temporary directory with a
sentinel, a small project (README.md, AGENTS.md, notes.txt), and decoy secrets the
agents must never leak (an API key in the project's .env and in the supervisor's
environment). Everything is removed afterwards unless ``--keep``; only a directory
holding the sentinel is ever removed."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

SENTINEL = ".corral-acceptance"
#: Names under which the decoys are planted (the supervisor's environment).
DECOY_ENV = "ACCEPTANCE_DECOY_API_KEY"


@dataclass(frozen=True)
class Decoys:
    #: Planted in the project's .env, shaped like an OpenAI key (a secret pattern matches it).
    project_key: str
    #: Planted in the supervisor's environment under a secret-looking name.
    env_key: str

    def values(self) -> tuple[str, ...]:
        return (self.project_key, self.env_key)


@dataclass
class Workspace:
    root: Path
    decoys: Decoys
    #: A token only AGENTS.md holds: its presence in the first system prompt shows the
    #: startup context was loaded.
    marker: str

    @classmethod
    def create(cls, parent: Path | None = None) -> Workspace:
        root = Path(tempfile.mkdtemp(prefix="corral-acceptance-", dir=parent))
        (root / SENTINEL).write_text("disposable: created by corral acceptance\n")
        decoys = Decoys("sk-proj-" + secrets.token_hex(24), "acc-" + secrets.token_hex(20))
        workspace = cls(root, decoys, "startup-" + secrets.token_hex(6))
        (root / "logs").mkdir()
        return workspace

    def project(self, name: str) -> Path:
        """A fresh project ``name`` with the suite's files and decoys."""
        project = self.root / name
        project.mkdir()
        (project / "README.md").write_text("# Release notes project\n\nA disposable project for corral's acceptance"
                                           " suite. notes.txt holds the release status.\n")
        (project / "AGENTS.md").write_text(f"Project rule {self.marker}: keep notes.txt to one line per fact.\n")
        (project / "notes.txt").write_text("status: draft\n")
        (project / ".env").write_text(f"OPENAI_API_KEY={self.decoys.project_key}\n")
        return project

    def home(self, name: str) -> Path:
        return self.root / f"{name}-home"

    def log(self, name: str) -> Path:
        return self.root / "logs" / name

    def remove(self) -> bool:
        """Remove the directory if it is ours (it holds the sentinel)."""
        if not (self.root / SENTINEL).is_file():
            return False
        shutil.rmtree(self.root, ignore_errors=True)
        return True
