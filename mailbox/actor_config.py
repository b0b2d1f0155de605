"""The boot config of an actor process, shared by both processes.

The supervision tree builds one per incarnation (supervisor/tree/supervision_tree.py
``start_actor``); the launcher carries it across the process boundary as msgpack,
unread (sandbox/launcher.py, then sandbox/forkserver.py or ``python -m corral.actors``);
the actor's runtime reads it (actors/runtime.py), and a template finds it as
``ctx.config``. The supervisor sets every key, so a reader never needs a default.
"""

from __future__ import annotations

from typing import Any, TypedDict

from corral.mailbox.transport import LinkKind


class ActorConfig(TypedDict):
    actor_id: str
    #: 1, 2, ... per restart of this actor in this boot; the hello repeats it.
    incarnation: int
    #: A built-in template's name, or a user ``module:Name`` reference.
    template: str
    #: Where the actor dials its link to the supervisor.
    address: str
    #: What the link is made of (mailbox/transport.py): the supervisor's end is the same.
    link: LinkKind
    #: Hex of the secret this incarnation proves when it dials its link (issue 48
    #: D.14): made per incarnation by the supervisor, carried only by the boot channel.
    link_secret: str
    #: The actor's ``params`` from the spec, for its template.
    params: dict[str, Any]
    #: The supervisor's home (logs, transcripts, the in-flight record).
    home: str
    #: The largest frame either side may send on the link, in bytes.
    max_frame: int
    #: How many messages the actor's inbox holds before senders wait.
    inbox_size: int
    #: The supervisor's pid, for failpoints that act on it.
    supervisor_pid: int
    #: The failpoint spec in force (empty: none).
    failpoints: str
    #: Seconds between the actor's heartbeats to the stall watchdog (0: none).
    #: Not the spec's ``[supervisor].heartbeat_s``, the supervisor's own endpoint heartbeat.
    heartbeat_interval_s: float
