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


def test_nodes_without_a_ledger_or_outside_random_mode_are_refused_clearly(pg_url: str) -> None:
    for argv in (
        ["--nodes", "3"],
        ["--nodes", "0", "--ledger", pg_url],
        ["--nodes", "3", "--ledger", pg_url, "--mode", "both"],
    ):
        result = subprocess.run([*CHAOS, *argv], capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 2 and result.stderr.startswith("corral: "), (argv, result.stderr[-2000:])
        assert "--nodes" in result.stderr, result.stderr


def test_a_user_who_may_not_create_databases_is_told_so_before_any_episode(
    short_tmp: Path, pg_url: str, postgres_server: Any
) -> None:
    import psycopg

    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS chaos_nocreatedb")
        conn.execute("CREATE ROLE chaos_nocreatedb LOGIN NOCREATEDB")
    url = pg_url.replace("user=postgres", "user=chaos_nocreatedb")
    result = subprocess.run(
        [*CHAOS, "--ledger", url, "--nodes", "3", "--kills", "2", "--mode", "random", "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=short_tmp,
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "CREATEDB" in result.stderr and "episode" not in result.stdout, result.stdout + result.stderr
