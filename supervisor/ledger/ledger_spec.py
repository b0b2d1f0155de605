"""``[ledger]``: where a supervisor keeps its ledger, and (with PostgreSQL) which
node it is.

```toml
[ledger]
url = "postgresql://corral@db.internal/corral"   # default: the home's SQLite file
node = "host-a"          # this supervisor's node id; default: from the host and home
lease_s = 10.0           # a node that misses its heartbeat this long is adopted
retire_idle_s = 60.0     # an adopted partition with no unfinished run this long is let go
shared_queue = true      # runs this node has no room for wait in the cluster's queue
max_runs = 16            # root runs pending or running on this node at once
max_runs_per_agent = 4   # runs of one agent pending or running on this node at once
queue_poll_s = 0.5       # how often a node with room looks at the shared queue
```

A password in ``url`` works but is better kept out of files: libpq reads
``PGPASSWORD`` and ``~/.pgpass``. ``corral up --ledger URL --node ID`` overrides
the table. The choice is remembered in the home (``ledger.json``, without the
password), so a restart comes back to the same ledger and partition.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from corral.supervisor.ledger.ledger_pg_cluster import PARTITION_NAME, is_postgres_url
from corral.supervisor.ledger.ledger_pg_wire import redact_url

if TYPE_CHECKING:  # the section is a pydantic model, and every `corral` command imports this module
    from corral.supervisor.spec.spec_models import LedgerSpec

LEDGER_FILE = "ledger.json"
URL_ENV = "CORRAL_LEDGER_URL"
DEFAULT_LEASE_S = 10.0
DEFAULT_RETIRE_IDLE_S = 60.0
#: A node's capacity for the cluster's shared queue (supervisor/cluster/run_queue.py).
DEFAULT_MAX_RUNS = 16
DEFAULT_MAX_RUNS_PER_AGENT = 4
DEFAULT_POLL_S = 0.5


class LedgerSpecError(ValueError):
    """Where the ledger is cannot be settled (a URL or node id from the command line or
    the environment, a home that needs its password again); the spec's own
    ``[ledger]`` table (``LedgerSpec``, supervisor/spec/spec_models.py) is checked as every
    section is, with a SpecError."""


def url_problem(url: Any) -> str:
    shown = redact_url(url) if isinstance(url, str) else url
    return f"must be postgresql://USER@HOST/DB (the default ledger is the home's SQLite file), not {shown!r}"


def node_problem(node: Any) -> str:
    return f"node id {node!r}: use 1-48 lowercase letters, digits, '-' or '_', starting with a letter or digit"


def check_url(url: Any) -> str:
    if not isinstance(url, str) or not is_postgres_url(url):
        raise LedgerSpecError(f"ledger url: {url_problem(url)}")
    return url


def check_node(node: Any) -> str:
    if not isinstance(node, str) or not PARTITION_NAME.match(node):
        raise LedgerSpecError(node_problem(node))
    return node


def default_node(home: Path) -> str:
    """Stable for a home on a host, distinct between hosts and homes."""
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")[:30] or "node"
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:6]
    return f"{host}-{digest}"


@dataclass(frozen=True)
class Placement:
    """Where this supervisor's ledger is: SQLite (``url`` None) or a partition of a
    PostgreSQL database, held by ``node`` (an adopted one: ``adopt`` names it)."""

    url: str | None
    node: str = ""
    lease_s: float = DEFAULT_LEASE_S
    retire_idle_s: float = DEFAULT_RETIRE_IDLE_S
    last_partition: str | None = None
    adopt: str | None = None
    epoch: int | None = None
    #: The shared queue (supervisor/cluster/run_queue.py): None: this node takes
    #: part in none, every submit runs here.
    queue: QueueSettings | None = None
    #: Requests wait for the database side by side (supervisor/ledger/cooperative.py).
    concurrent: bool = False

    @property
    def cluster(self) -> str | None:
        """The cluster this node belongs to, as a digest of its database's address
        (host, port, database, socket directory; never the user or the password), or
        None for a home. Its nodes share a project root (supervisor/home/project_lock.py)."""
        if self.url is None:
            return None
        parts = urlsplit(self.url)
        query = sorted((key, value) for key, value in parse_qsl(parts.query) if key in ("host", "port", "dbname"))
        where = f"{parts.hostname or ''}:{parts.port or ''}{parts.path}?{query}"
        return hashlib.sha256(where.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class QueueSettings:
    """A node's part in the cluster's shared queue: its capacity and poll."""

    max_runs: int = DEFAULT_MAX_RUNS
    max_runs_per_agent: int = DEFAULT_MAX_RUNS_PER_AGENT
    poll_s: float = DEFAULT_POLL_S


def resolve(home: Path, spec: LedgerSpec | None, *, cli_url: str | None, cli_node: str | None) -> Placement:
    """The command line, then ``$CORRAL_LEDGER_URL``, then the spec, then what the
    home used last; none of them: SQLite."""
    from corral.supervisor.spec.spec_models import LedgerSpec

    remembered = remembered_placement(home)
    spec = spec or LedgerSpec()
    url = cli_url or os.environ.get(URL_ENV) or spec.url or remembered.get("url")
    if not url:
        if remembered.get("shown_url"):
            # Never fall back to an empty SQLite ledger beside the real one.
            raise LedgerSpecError(
                f"this home ran on the PostgreSQL ledger {remembered['shown_url']}, whose password is not"
                " stored: pass --ledger URL again, or put the password in PGPASSWORD or ~/.pgpass"
            )
        return Placement(None)
    check_url(url)
    node = cli_node or spec.node or remembered.get("node") or default_node(home)
    check_node(node)
    last = remembered.get("partition") if remembered.get("node") == node else None
    queue = QueueSettings(spec.max_runs, spec.max_runs_per_agent, spec.queue_poll_s) if spec.shared_queue else None
    return Placement(url, node, spec.lease_s, spec.retire_idle_s, last_partition=last, queue=queue,
                     concurrent=spec.concurrent_requests)


def remembered_placement(home: Path) -> dict[str, Any]:
    try:
        data = json.loads((home / LEDGER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember(home: Path, placement: Placement, partition: str) -> None:
    """Written 0600, and without a password (libpq's PGPASSWORD or ~/.pgpass)."""
    assert placement.url is not None
    url = placement.url if "***" not in redact_url(placement.url) else None
    record = {"url": url, "shown_url": redact_url(placement.url), "node": placement.node, "partition": partition}
    path = home / LEDGER_FILE
    staging = path.with_name(path.name + ".new")
    staging.write_text(json.dumps(record, indent=2))
    staging.chmod(0o600)
    os.replace(staging, path)


def open_for_reading(home: Path) -> Any:
    """The ledger a home writes to, opened to read (tools, tests, chaos): its SQLite
    file, or its partition of the PostgreSQL ledger it remembers (the URL from
    ``$CORRAL_LEDGER_URL`` when the home could not keep it: it has a password)."""
    from corral.supervisor.home.home_dir import LEDGER
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger

    remembered = remembered_placement(home)
    if not remembered.get("shown_url"):
        return SqliteLedger(home / LEDGER, readonly=True)
    url = remembered.get("url") or os.environ.get(URL_ENV)
    if not url:
        raise LedgerSpecError(
            f"{home} writes to the PostgreSQL ledger {remembered['shown_url']}: set {URL_ENV} (with its password)"
        )
    return PostgresLedger(url, str(remembered.get("partition")), readonly=True)
