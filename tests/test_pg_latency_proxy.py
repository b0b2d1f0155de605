"""The bench's latency proxy (bench/pg_proxy.py): what it counts is what a
PostgreSQL client waited for, and every answer reaches the client at least the
configured delay each way after it was asked for."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("psycopg")

from bench.pg_proxy import latency_proxy


def _proxied(postgres_server: Any, pg_url: str, delay_s: float = 0.0) -> Any:
    database = pg_url.split("///", 1)[1].split("?", 1)[0]
    proxy = latency_proxy(postgres_server.socket_dir / ".s.PGSQL.5432", delay_s)
    return proxy, database


def test_each_statement_waited_for_is_one_round_trip_and_a_pipeline_is_one(postgres_server: Any, pg_url: str) -> None:
    import psycopg

    proxy_cm, database = _proxied(postgres_server, pg_url)
    with proxy_cm as proxy, psycopg.connect(proxy.url(database), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (k INT)")
        before = proxy.round_trips
        for value in range(5):
            conn.execute("INSERT INTO t VALUES (%s)", (value,))
        assert proxy.round_trips - before == 5
        before = proxy.round_trips
        with conn.pipeline():
            for value in range(5):
                conn.execute("INSERT INTO t VALUES (%s)", (value,))
        # psycopg's pipeline writes as it goes, but waits for the answers once.
        assert proxy.round_trips - before == 1
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (10,)
    assert proxy.connections == 1


def test_the_delay_holds_each_way_and_stop_leaves_no_thread(postgres_server: Any, pg_url: str) -> None:
    import psycopg

    delay = 0.05
    proxy_cm, database = _proxied(postgres_server, pg_url, delay)
    with proxy_cm as proxy, psycopg.connect(proxy.url(database), autocommit=True) as conn:
        started = time.monotonic()
        for _ in range(4):
            conn.execute("SELECT 1")
        # A lower bound only: each answer waits out the delay both ways.
        assert time.monotonic() - started >= 4 * 2 * delay
    assert not [t for t in threading.enumerate() if t.name == "pg-latency-proxy"]
