"""How corral's processes are named in ``ps`` and ``top``.

The title (``ps`` shows it as the command line) is set with ``setproctitle``,
which moves the environment out of the way first; python-prctl's
``set_proctitle`` wrote over it, and a process that had changed its environment
(the supervisor does, for user code on ``PYTHONPATH``) crashed with SIGSEGV.
The short name (``top``, ``ps -o comm``, ``pgrep``; at most 15 bytes) is set last,
because setting the title also truncates it into the short name.
"""

from __future__ import annotations

import prctl
import setproctitle


def name_process(title: str, short: str | None = None) -> None:
    setproctitle.setproctitle(title)
    prctl.set_name((short or title)[:15])
