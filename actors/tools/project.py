"""The project tools (seed 004 V1.3, V1.4, V1.12), one module each:

* ``project.changeset``: several file changes, atomically, after a checkpoint (project_changeset.py);
* ``project.diff`` and ``project.restore``: what changed since a checkpoint, and putting
  its files back (project_diff.py, project_restore.py);
* ``project.verify``: the project's verify commands, recorded against the project
  revision (project_verify.py);
* ``project.git_inspect``, the seed's ``git.inspect``: status and a bounded diff in one
  consistent review (git_inspect.py);
* ``project.git_status``, ``project.git_diff``, ``project.git_snapshot`` and
  ``project.git_commit``, the only git write (project_git.py);
* ``project.index``: the repository context, built again now (project_index.py).
"""

from __future__ import annotations

from corral.actors.tools.base import Tool
from corral.actors.tools.git_inspect import GitInspect
from corral.actors.tools.project_changeset import Changeset
from corral.actors.tools.project_diff import ProjectDiff
from corral.actors.tools.project_git import GitCommit, GitDiff, GitSnapshot, GitStatus
from corral.actors.tools.project_index import ProjectIndex
from corral.actors.tools.project_restore import ProjectRestore
from corral.actors.tools.project_verify import ProjectVerify

TOOLS: list[Tool] = [Changeset(), ProjectDiff(), ProjectRestore(), GitInspect(), GitStatus(), GitDiff(), GitSnapshot(),
                   GitCommit(), ProjectVerify(), ProjectIndex()]

__all__ = ["TOOLS", "Changeset", "GitCommit", "GitDiff", "GitInspect", "GitSnapshot", "GitStatus", "ProjectDiff",
           "ProjectIndex", "ProjectRestore", "ProjectVerify"]
