"""Reading a home with no supervisor (issue 34, item 5): after `corral down`,
`show`, `runs`, `events` and `intent receipts` answer from the ledger, read-only,
and say so; they write nothing (the ledger's bytes and every file and directory of
the home are as they were); a home that never had a supervisor is a clear error;
and a home whose lock a supervisor holds (starting) is never read behind its back."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.offline_read import SupervisorStarting
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_spec import URL_ENV
from tests.harness import CORRAL, cli, running, wait_run
from tests.test_intent import SPEC, act, document, script


def _write_page() -> str:
    return script([act("fs.write", path="docs/launch.md", content="# Launch\n")], "the page is written")


@pytest.fixture(scope="module")
def finished() -> Iterator[dict[str, Any]]:
    """A home whose supervisor ran one run bound to an intent contract to completion
    and was stopped with `corral down`; what the supervisor answered, kept to compare."""
    top = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    try:
        (top / "ws" / "docs").mkdir(parents=True)
        home = top / "home"
        with running(home, SPEC) as daemon:
            run_id = daemon.call("run", agent_id="writer", task="launch page", script=_write_page(),
                                 intent=document())["run_id"]
            assert wait_run(daemon, run_id, {"completed", "failed", "needs-input"})["run"]["status"] == "completed"
            live = cli(home, "show", run_id, "--json")
            assert live.returncode == 0 and "read from the ledger" not in live.stderr, live.stderr
            answered = {
                "show": json.loads(live.stdout),
                "runs": daemon.call("runs")["runs"],
                "receipts": daemon.call("intent.receipts", run_id=run_id),
                "events": daemon.events(),
            }
            assert "read_from" not in answered["show"], "through a supervisor, nothing changes"
            down = cli(home, "down")
            assert down.returncode == 0, down.stderr
        assert not homes.is_locked(home)
        yield {"home": home, "run_id": run_id, **answered}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def state_of(home: Path) -> dict[str, Any]:
    """Every file and directory of a home (size and modification time: a file made
    and removed again moves its directory's), and the ledger's bytes."""
    entries = {
        str(path.relative_to(home)): (path.is_dir(), path.lstat().st_size, path.lstat().st_mtime_ns)
        for path in [home, *sorted(home.rglob("*"))]
    }
    ledger = home / homes.LEDGER
    digest = hashlib.sha256(ledger.read_bytes()).hexdigest() if ledger.exists() else None
    return {"entries": entries, "ledger": digest}


def read_from_ledger(result: subprocess.CompletedProcess[str]) -> bool:
    return "read from the ledger" in result.stderr and "no supervisor is running" in result.stderr


def test_show_runs_events_and_receipts_answer_after_down_and_write_nothing(finished: dict[str, Any]) -> None:
    home, run_id = finished["home"], finished["run_id"]
    before = state_of(home)

    text = cli(home, "show", run_id)
    assert text.returncode == 0, text.stderr
    assert f"run {run_id}  agent writer" in text.stdout and "status completed" in text.stdout
    assert "fs.write" in text.stdout and "final reply: the page is written" in text.stdout
    assert read_from_ledger(text) and len(text.stderr.splitlines()) == 1

    shown = cli(home, "show", run_id, "--json")
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    offline = json.loads(shown.stdout)
    assert offline.pop("read_from") == "ledger"
    # The supervisor's own view of the run, less the sections its features add.
    assert offline == {key: finished["show"][key] for key in offline}
    assert {"run", "actions", "receipts", "provider_requests", "final_reply", "finalization"} <= set(offline)

    runs = cli(home, "runs")
    assert runs.returncode == 0 and run_id in runs.stdout and "completed" in runs.stdout and read_from_ledger(runs)
    listed = json.loads(cli(home, "runs", "--json").stdout)
    assert [{k: v for k, v in run.items() if k != "read_from"} for run in listed] == finished["runs"]
    assert {run["read_from"] for run in listed} == {"ledger"}

    events = cli(home, "events")
    assert events.returncode == 0 and read_from_ledger(events), events.stderr
    assert any("run-completed" in line and run_id in line for line in events.stdout.splitlines())
    streamed = [json.loads(line) for line in cli(home, "events", "--json").stdout.splitlines()]
    seen = finished["events"]  # the supervisor's stream before `corral down`; the shutdown's events follow
    assert [{k: v for k, v in e.items() if k != "read_from"} for e in streamed][: len(seen)] == seen
    assert streamed[-1]["kind"] == "boot-ended" and {event["read_from"] for event in streamed} == {"ledger"}
    since = streamed[-2]["cursor"]
    assert [json.loads(line)["cursor"] for line in cli(home, "events", "--since", str(since), "--json")
            .stdout.splitlines()] == [streamed[-1]["cursor"]]

    receipts = cli(home, "intent", "receipts", run_id)
    assert receipts.returncode == 0 and read_from_ledger(receipts), receipts.stderr
    assert "continue" in receipts.stdout
    judged = json.loads(cli(home, "intent", "receipts", run_id, "--json").stdout)
    assert judged.pop("read_from") == "ledger"
    assert judged == finished["receipts"] and judged["receipts"]

    assert state_of(home) == before, "a read wrote to the home"


def test_the_python_client_reads_the_same_way(finished: dict[str, Any]) -> None:
    home, run_id = finished["home"], finished["run_id"]
    before = state_of(home)
    with pytest.raises(corral.NotRunning):
        corral.Client.connect(home)  # a client of a supervisor still needs one
    with corral.Client.reading(home) as client:
        result = client.show(run_id)
        assert client.read_ledger and result.status == "completed" and result.raw["read_from"] == "ledger"
        cursors = [event.cursor for event in client.events()]
        assert cursors[: len(finished["events"])] == [e["cursor"] for e in finished["events"]]
        assert client.intent_receipts(run_id)["receipts"] == finished["receipts"]["receipts"]
        with pytest.raises(corral.ControlError) as missing:
            client.show("run-nosuchrun")
        assert missing.value.code == "not-found"
        with pytest.raises(corral.NotRunning):
            client.status()  # everything else needs a supervisor
        with pytest.raises(corral.NotRunning):
            next(iter(client.events(follow=True)))
    assert state_of(home) == before


def test_an_unknown_run_is_the_error_a_supervisor_gives(finished: dict[str, Any]) -> None:
    result = cli(finished["home"], "show", "run-nosuchrun")
    assert result.returncode == 1 and "not-found: no run 'run-nosuchrun'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_home_that_never_had_a_supervisor_is_a_clear_error(short_tmp: Path) -> None:
    empty = short_tmp / "empty"
    empty.mkdir(mode=0o700)
    before = state_of(empty)
    for home in (short_tmp / "nothing", empty):
        for args in (["show", "run-x"], ["runs"], ["events"], ["intent", "receipts", "run-x"], ["runs", "--json"]):
            result = cli(home, *args)
            assert result.returncode == 4, (args, result.stderr)
            assert f"no supervisor is running on {home}, and it has no ledger to read" in result.stderr
            assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (short_tmp / "nothing").exists(), "a read made the home"
    assert state_of(empty) == before


def test_a_starting_supervisor_is_waited_for_never_read_behind(finished: dict[str, Any]) -> None:
    # The lock a supervisor takes first thing when it starts (supervisor/__main__.py),
    # before its ledger and its endpoint: held here by the test.
    home, run_id = finished["home"], finished["run_id"]
    lock = homes.HomeLock(home)
    lock.acquire()
    waiting: subprocess.Popen[str] | None = None
    try:
        with corral.Client.reading(home, timeout=0.5) as client, pytest.raises(SupervisorStarting) as starting:
            client.show(run_id)
        assert "a supervisor is starting" in str(starting.value) and not client.read_ledger
        said = cli(home, "show", run_id, "--json")
        assert said.returncode == 4 and said.stdout == "", said.stdout
        assert "a supervisor is starting" in said.stderr and "not read behind its back" in said.stderr

        waiting = subprocess.Popen(
            [*CORRAL, "--home", str(home), "show", run_id, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(2)  # far longer than a read of the ledger takes
        assert waiting.poll() is None, "it read the ledger while a supervisor held the home"
    finally:
        lock.release()
        out, err = waiting.communicate(timeout=60) if waiting is not None else ("", "")
    assert waiting.returncode == 0, err
    assert json.loads(out)["read_from"] == "ledger", "the lock let go without a supervisor: the ledger answers"


def test_a_killed_supervisors_ledger_is_read_with_its_log_and_left_as_it_is(short_tmp: Path) -> None:
    (short_tmp / "ws" / "docs").mkdir(parents=True)
    home = short_tmp / "home"
    with running(home, SPEC) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="launch page", script=_write_page(),
                             intent=document())["run_id"]
        assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"
        daemon.kill_supervisor()
        assert (home / "endpoint.json").exists(), "a killed supervisor leaves its endpoint file"
        wal = home / (homes.LEDGER + "-wal")
        assert wal.exists() and wal.stat().st_size > 0, "the commits are still in the write-ahead log"
        wal_bytes = wal.read_bytes()
        names = sorted(str(path.relative_to(home)) for path in home.rglob("*"))
        ledger = hashlib.sha256((home / homes.LEDGER).read_bytes()).hexdigest()
        shown = cli(home, "show", run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["run"]["status"] == "completed"
        assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == names
        assert hashlib.sha256((home / homes.LEDGER).read_bytes()).hexdigest() == ledger
        assert wal.read_bytes() == wal_bytes


def test_following_events_still_needs_a_supervisor(finished: dict[str, Any]) -> None:
    result = cli(finished["home"], "events", "--follow", timeout=30)
    assert result.returncode == 4 and "no supervisor is running" in result.stderr, result.stderr


def test_a_home_on_postgresql_reads_its_partition(short_tmp: Path, pg_url: str) -> None:
    (short_tmp / "ws" / "docs").mkdir(parents=True)
    home = short_tmp / "home"
    with running(home, SPEC, env={URL_ENV: pg_url}) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="launch page", script=_write_page(),
                             intent=document())["run_id"]
        assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"
        assert cli(home, "down").returncode == 0
    assert not (home / homes.LEDGER).exists(), "the ledger is the database's partition, not a file"
    before = state_of(home)
    shown = cli(home, "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    offline = json.loads(shown.stdout)
    assert offline["read_from"] == "ledger" and offline["run"]["status"] == "completed"
    receipts = cli(home, "intent", "receipts", run_id)
    assert receipts.returncode == 0 and read_from_ledger(receipts) and "continue" in receipts.stdout
    assert state_of(home) == before
