"""``corral chaos --nodes 3`` on a real PostgreSQL: each episode on a database of
its own, three nodes on it, its work submitted to one of them (the shared queue
spreads it), kills among all three, the invariants read across the partitions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CHAOS = [sys.executable, "-m", "corral", "chaos"]


def _databases(postgres_server: Any) -> set[str]:
    import psycopg

    with psycopg.connect(postgres_server.url()) as conn:
        return {str(row[0]) for row in conn.execute("SELECT datname FROM pg_database").fetchall()}


def test_a_three_node_random_campaign_keeps_every_invariant_across_the_partitions(
    short_tmp: Path, pg_url: str, postgres_server: Any
) -> None:
    before = _databases(postgres_server)
    report_path = short_tmp / "report.json"
    result = subprocess.run(
        [
            *CHAOS,
            "--ledger",
            pg_url,
            "--nodes",
            "3",
            "--kills",
            "2",
            "--mode",
            "random",
            "--seed",
            "2030",
            "--quiet",
            "--json",
            str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["passed"] and report["kills"] == 2 and report["nodes"] == 3, report
    assert all(entry["passed"] for entry in report["invariants"].values()), report["invariants"]
    for episode in report["episode_details"]:
        # Each episode ran on three partitions of a database of its own, and its
        # runs were spread by the shared queue to more than the node given them.
        assert sorted(episode["partitions"]) == ["node-0", "node-1", "node-2"], episode
        assert len(set(episode["ran_on"].values())) >= 2, episode
    assert len({e["database"] for e in report["episode_details"]}) == report["episodes"]
    assert _databases(postgres_server) == before, "every episode's database was dropped"
