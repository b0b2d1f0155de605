"""The fork server's actor side: ``python -m corral.actors.fork_host FD PID``.

sandbox/forkserver.py forks and reaps; what it preloads before the first fork and
what each child runs are the actor runtime's (actors/runtime.py), handed to it
here, so the sandbox layer never imports the actors'.
"""

from __future__ import annotations

import gc

if __name__ == "__main__":
    # What the imports and the preload build lives as long as this process and is
    # frozen once it is built (forkserver.serve): the collector scanning it again and
    # again meanwhile was about a tenth of the fork server's start-up CPU (measured).
    gc.disable()

# The actor runtime, imported once here; serve() preloads the rest before forking.
from corral.actors import runtime
from corral.sandbox import forkserver

ENTRY = forkserver.ActorEntry(preload=runtime.preload, main=runtime.actor_main)

if __name__ == "__main__":
    forkserver.main(ENTRY)
