"""The project tools (seed 004 V1.3, V1.4, V1.12), one module each:

* ``project.changeset``: several file changes, atomically (project_changeset.py);
* ``project.git_status``, ``project.git_diff`` and ``project.git_commit``, the only
  git write (project_git.py).
"""

from __future__ import annotations

from corral.actors.tools.base import Tool
from corral.actors.tools.project_changeset import Changeset
from corral.actors.tools.project_git import GitCommit, GitDiff, GitStatus

TOOLS: list[Tool] = [Changeset(), GitStatus(), GitDiff(), GitCommit()]

__all__ = ["TOOLS", "Changeset", "GitCommit", "GitDiff", "GitStatus"]
