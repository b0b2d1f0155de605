"""What the client sends besides a method's own parameters: where it goes (the
control endpoint a home's supervisor wrote), the run id it chooses (or an
idempotency key names), and the fingerprint a decision is bound to. Small and
pure, apart from ``AsyncClient`` (corral/async_client.py), which uses them.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from corral.client_types import Pending
from corral.mailbox.control import ControlClient
from corral.supervisor.home import home_dir as homes


def connect(home: Path, timeout: float = 10.0) -> ControlClient:
    """A control connection to the supervisor that runs on ``home`` now (the
    endpoint is read each time: a restarted supervisor has a new address and token)."""
    endpoint = homes.read_endpoint(home)
    return ControlClient(endpoint.control, endpoint.token, timeout=timeout, pid=endpoint.pid)


def new_run_id() -> str:
    """A client-chosen run id: sent with the create request, it makes a retried
    ``run`` return the run created by a lost first attempt instead of a second one."""
    return "run-c" + secrets.token_hex(12)


def key_run_id(idempotency_key: str) -> str:
    """The run an idempotency key names: the same id wherever it is given (any
    node of a cluster, its front door), so the cluster answers that run."""
    import hashlib

    if not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 500:
        raise ValueError("an idempotency key is a string of 1 to 500 characters")
    return "run-k" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:24]


#: Sent when the action was not waiting in ``pending()``: it matches no fingerprint, so
#: the supervisor decides nothing and says why the action is not waiting (superseded by
#: a steer, denied, its run cancelled) or, had it just begun waiting, that this is not
#: the one seen.
UNSEEN_FINGERPRINT = "unseen"


def decision_fingerprint(pending: Pending, action_id: str) -> str:
    for action in pending.actions:
        if action["action_id"] == action_id and action["phase"] == "waiting-confirmation":
            return str(action["fingerprint"])
    return UNSEEN_FINGERPRINT
