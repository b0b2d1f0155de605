"""Seed 004, V1.41 and V1.43: secrets in a provider's response.

- V1.43: "命中 API Key、Token、password/client secret/private key/credential 等敏感
  key ... 时，handoff 写入失败并进入 reconciliation": a tool plan holding a secret
  value fails its handoff closed. Nothing of the response is stored (not the ledger,
  not the private spool, not the workspace), and the request waits for a person.
- V1.43: "完整 function arguments 为恢复语义不得被静默脱敏或改写": code that only
  names a secret (``token = get_token()``) is no secret; it reaches the disk as the
  model wrote it, not redacted on the way.
- V1.41: "响应落盘前会...依次过滤密钥": a text reply is stored filtered, and no raw
  copy of it is kept anywhere.

Real supervisor, real agent, the OpenAI-compatible provider against a fake server.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from corral.actors.providers.thinking import MALFORMED
from corral.core.secret_values import secret_values_in
from corral.supervisor.runs import response_secrets
from fake_openai import FakeOpenAIServer, Reply, completion, tool_call
from loopback_http import serve_in_thread
from tests.harness import Daemon, ledger_rows, wait_run
from tests.test_openai_durable import DECOY_KEY, openai_spec

AUTO_WRITES = '\n[policy]\n"fs.write" = "auto"\n'


def _spec(tmp: Path, url: str) -> Path:
    spec = openai_spec(tmp, url)
    spec.write_text(spec.read_text() + AUTO_WRITES)
    return spec


def _fresh_secrets() -> dict[str, str]:
    """Values made for this test only: no other file holds them by chance."""
    return {
        "api key": "sk-proj-" + secrets.token_hex(16),
        "private key": "MIIEow" + secrets.token_hex(20),
        "password": "pw" + secrets.token_hex(8),
    }


def _files_holding(root: Path, value: str) -> list[str]:
    needle = value.encode()
    return [str(path) for path in root.rglob("*") if path.is_file() and needle in path.read_bytes()]


def test_a_tool_plan_holding_a_secret_fails_its_handoff_closed_and_nothing_of_it_is_stored(short_tmp: Path) -> None:
    values = _fresh_secrets()
    content = "\n".join(
        [
            f"OPENAI = '{values['api key']}'",
            "-----BEGIN RSA PRIVATE KEY-----",
            values["private key"],
            "-----END RSA PRIVATE KEY-----",
            f'db_password = "{values["password"]}"',
            "",
        ]
    )
    write = tool_call("fs.write", {"path": "settings.py", "content": content}, "call-1")
    server = FakeOpenAIServer([Reply(body=completion(None, [write])), Reply(body=completion("nothing written"))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="write the settings")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
            assert "secret" in shown["run"]["reason"]
            (request,) = shown["provider_requests"]
            assert request["status"] == "needs-reconciliation"
            # Nothing of the response was stored, nothing acted on, nothing sent again.
            assert ledger_rows(daemon.home, "SELECT response, raw_sha256 FROM provider_requests")[0]["response"] is None
            assert ledger_rows(daemon.home, "SELECT * FROM plans") == []
            assert ledger_rows(daemon.home, "SELECT * FROM actions") == []
            assert not (short_tmp / "ws" / "settings.py").exists()
            assert len(server.requests) == 1
            pending = daemon.call("pending")["provider_requests"]
            assert [p["slot"] for p in pending] == [request["slot"]]
            for name, value in values.items():
                assert _files_holding(daemon.home, value) == [], name
            # A person reconciles it: the request may be sent again, and the run goes on.
            daemon.call("reconcile", action_id=request["slot"], outcome="failed", note="checked: a leaked key")
            shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
            assert shown["run"]["status"] == "completed", shown["run"]
            assert shown["final_reply"] == "nothing written"
            assert len(server.requests) == 2
            daemon.shutdown()
            for name, value in values.items():
                assert _files_holding(daemon.home, value) == [], name
                assert _files_holding(short_tmp / "ws", value) == [], name
        finally:
            daemon.shutdown()


def test_code_that_only_names_a_secret_reaches_the_disk_as_the_model_wrote_it(short_tmp: Path) -> None:
    content = "import os\ntoken = get_token()\napi_key = os.environ['API_KEY']\nsecret = vault.read(path)\n"
    write = tool_call("fs.write", {"path": "auth.py", "content": content}, "call-1")
    server = FakeOpenAIServer([Reply(body=completion(None, [write])), Reply(body=completion("written"))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="write the auth module")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "completed", shown["run"]
            assert (short_tmp / "ws" / "auth.py").read_text() == content
        finally:
            daemon.shutdown()


def test_a_final_reply_holding_a_secret_is_stored_filtered_and_kept_raw_nowhere(short_tmp: Path) -> None:
    value = "sk-proj-" + secrets.token_hex(16)
    server = FakeOpenAIServer([Reply(body=completion(f"The key you asked about is {value}."))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="which key")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "completed", shown["run"]
            assert value not in json.dumps(shown)
            assert "[redacted]" in shown["final_reply"]
            rows = ledger_rows(daemon.home, "SELECT raw_sha256 FROM provider_requests")
            assert [row["raw_sha256"] for row in rows] == [None]
            daemon.shutdown()
            assert _files_holding(daemon.home, value) == []
        finally:
            daemon.shutdown()


def test_a_final_reply_is_stored_with_project_and_other_absolute_paths_filtered(short_tmp: Path) -> None:
    """Seed 004 V1.41: "响应落盘前会...依次过滤密钥、项目路径和其它绝对路径": the
    secret first, then the project's root (``<project>``), then every other absolute
    path (``<absolute-path>``); relative paths and HTTP(S) URLs stay as written."""
    value = "sk-proj-" + secrets.token_hex(16)
    root = str((short_tmp / "ws").resolve())
    reply = (
        f"Done: wrote {root}/src/app.py, read /etc/hosts and C:\\Users\\ana\\notes.txt;"
        f" see https://example.com/a/b and docs/readme.md. The key was {value}."
    )
    server = FakeOpenAIServer([Reply(body=completion(reply))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="what did you do")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "completed", shown["run"]
            final = shown["final_reply"]
            assert final.startswith("Done: wrote <project>/src/app.py, read <absolute-path> and <absolute-path>;")
            assert "see https://example.com/a/b and docs/readme.md." in final
            assert "[redacted]" in final
            stored = [row["response"] for row in ledger_rows(daemon.home, "SELECT response FROM provider_requests")]
            stored += [row["plan"] for row in ledger_rows(daemon.home, "SELECT plan FROM plans")]
            for text in [final, *stored]:
                for leaked in (root, "/etc/hosts", "notes.txt", value):
                    assert leaked not in text, (leaked, text)
            rows = ledger_rows(daemon.home, "SELECT raw_sha256 FROM provider_requests")
            assert [row["raw_sha256"] for row in rows] == [None]
        finally:
            daemon.shutdown()


def test_a_text_reply_is_stored_without_its_thinking(short_tmp: Path) -> None:
    """Seed 004 V1.41: "响应落盘前会删除 thinking block，并依次过滤...": nothing of a
    reasoning block reaches the ledger, not its words and not its tags."""
    thought = "scratch-" + secrets.token_hex(8)
    server = FakeOpenAIServer([Reply(body=completion(f"<think>{thought} maybe 41</think>The answer is 42."))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="what is the answer")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "completed", shown["run"]
            assert shown["final_reply"] == "The answer is 42."
            daemon.shutdown()
            assert _files_holding(daemon.home, thought) == []
        finally:
            daemon.shutdown()


def test_thinking_leaves_a_response_and_a_tool_calls_arguments_stay_as_written() -> None:
    """V1.43: the tool-plan handoff keeps "去除 thinking 后的响应" and the "完整 function
    call envelope": reasoning fields and blocks go, the arguments are untouched."""
    arguments = json.dumps({"path": "a.html", "content": "<think>not mine</think><p>kept</p>"})
    body = completion("<think>plan it</think>", [tool_call("fs.write", arguments, "call-1")])
    body["choices"][0]["message"]["reasoning_content"] = "I should write a.html"
    stored = json.loads(response_secrets.without_thinking(json.dumps(body)))
    message = stored["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"] == ""
    assert message["tool_calls"][0]["function"]["arguments"] == arguments
    plain = completion("no thinking here")
    assert response_secrets.without_thinking(json.dumps(plain)) == json.dumps(plain), "unchanged: same bytes"
    assert response_secrets.without_thinking("<think>hm</think>final words") == "final words"
    # Left open after the answer (the model ran out of tokens mid-thought): the
    # thought is not stored either (V1.43: "未闭合或孤立 thinking wrapper 不保存 thinking 正文").
    assert response_secrets.without_thinking("answer <think>unclosed thinking") == MALFORMED
    assert response_secrets.without_thinking("answer <reasoning x='1'>half") == MALFORMED
    # Content parts: a reasoning part and a block inside a text part are not stored either.
    parts = completion("x")
    parts["choices"][0]["message"]["content"] = [
        {"type": "reasoning", "text": "hidden part"}, {"type": "text", "text": "<think>hidden block</think>the answer"}]
    kept = json.loads(response_secrets.without_thinking(json.dumps(parts)))["choices"][0]["message"]["content"]
    assert kept == "the answer"


def test_a_compaction_summary_is_stored_with_its_paths_filtered_too(short_tmp: Path) -> None:
    """Seed 004 V1.41 writes the compaction summary through the same text handoff
    ("tool-plan 前置自动 context-compaction ... 三种无工具调用文本请求") and scans for
    "compaction summary ... 和项目/配置绝对路径公共泄漏均为 0": the stored summary names
    the project's root as ``<project>`` and no other absolute path."""
    root = str((short_tmp / "ws").resolve())
    question = {
        "questions": [
            {
                "id": "go_on",
                "header": "Continue",
                "question": "go on?",
                "options": [{"label": "yes", "description": "carry on"}, {"label": "no", "description": "stop"}],
            }
        ]
    }
    replies = [Reply(body=completion(None, [tool_call("fs.list", {"path": "."}, f"call-{n}")])) for n in range(5)]
    replies += [
        Reply(body=completion(None, [tool_call("user.input_request", question, "call-ask")])),
        Reply(body=completion(f"Listed {root}/src five times; the config is /etc/shop.toml.")),
        Reply(body=completion("done")),
    ]
    server = FakeOpenAIServer(replies)
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="list, ask, then finish")["run_id"]
            wait_run(daemon, run_id, {"needs-input", "completed", "failed"})
            daemon.call("compact", run_id=run_id)
            (request,) = [q for q in daemon.call("pending")["questions"] if q["run_id"] == run_id]
            daemon.call("answer", run_id=run_id, request_id=request["request_id"], response_id="resp-yes", text="yes")
            shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
            assert shown["run"]["status"] == "completed", shown["run"]
            (summary,) = [row["summary"] for row in ledger_rows(daemon.home, "SELECT summary FROM compactions")]
            assert summary == "Listed <project>/src five times; the config is <absolute-path>."
        finally:
            daemon.shutdown()


@pytest.mark.parametrize(
    ("program", "args", "cwd"),
    [
        ("python3", ["{root}/check.py"], None),
        ("python3", ["check.py", "--config=/etc/app.toml"], None),
        ("/usr/bin/python3", ["check.py"], None),
        ("python3", ["check.py"], "{root}/src"),
        # A script is a command argument too (the seed's command.exec has no shell):
        # the path inside it is the one the command reaches.
        ("sh", ["-c", "cat /etc/hostname"], None),
        # Glued to a multi-letter option (a fourth strict re-audit).
        ("gcc", ["-isystem/usr/include", "x.c"], None),
    ],
)
def test_an_absolute_path_in_a_commands_arguments_fails_its_handoff_closed(
    short_tmp: Path, program: str, args: list[str], cwd: str | None
) -> None:
    """Seed 004 V1.43: "命中...结构化可执行路径/命令参数中的项目及其它绝对路径时，
    handoff 写入失败并进入 reconciliation": the program, an argument or the working
    directory of ``command.exec`` naming the project's root or any other absolute
    path. Nothing of the response is stored, nothing runs, and a person reconciles."""
    root = str((short_tmp / "ws").resolve())
    command: dict[str, object] = {"program": program, "args": [arg.format(root=root) for arg in args]}
    if cwd is not None:
        command["cwd"] = cwd.format(root=root)
    call = tool_call("command.exec", command, "call-1")
    server = FakeOpenAIServer([Reply(body=completion(None, [call]))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="run the check")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
            assert "absolute path" in shown["run"]["reason"]
            assert root not in shown["run"]["reason"] and "/etc/" not in shown["run"]["reason"]
            (request,) = shown["provider_requests"]
            assert request["status"] == "needs-reconciliation"
            assert ledger_rows(daemon.home, "SELECT response FROM provider_requests")[0]["response"] is None
            assert ledger_rows(daemon.home, "SELECT * FROM plans") == []
            assert ledger_rows(daemon.home, "SELECT * FROM actions") == []
            assert len(server.requests) == 1
        finally:
            daemon.shutdown()


def test_a_script_argument_naming_a_host_path_is_one_and_a_plain_script_is_not() -> None:
    """V1.43 reads a command's arguments whole: a ``-c`` script is one, and the host
    paths it names are the ones the command reaches."""
    def plan(program: str, *args: str) -> dict[str, object]:
        return {"actions": [{"tool": "command.exec", "input": {"program": program, "args": list(args)}}]}

    refused = [plan("python3", "-c", "print(open('/home/u/.ssh/id_rsa').read())"),
               plan("sh", "-c", "ls /srv/p/src 2>/dev/null"), plan("bash", "-lc", "cd /tmp && make"),
               plan("sh", "-c", r"type C:\Users\ana\notes.txt"), plan("sh", "-c", "cat </etc/hostname"),
               plan("sh", "-c", "make 2>/tmp/build.log"), plan("sh", "-c", "tar -C/etc -cf out.tar ."),
               plan("curl", "-d", "@/etc/passwd"), plan("curl", "-s", "--data-binary=@/home/u/.ssh/id_rsa"),
               plan("gcc", "x.c", "-isystem/usr/include"), plan("./configure", "-q", "--prefix/usr/local"),
               plan("curl", "-s", "file%3A%2F%2F%2Fetc%2Fpasswd"), plan("sh", "-c", "cc -isystem/usr/include x.c")]
    for each in refused:
        assert response_secrets.command_paths(each) == ("action 0 command.exec args[1]",), each
    allowed = [plan("sh", "-c", "ls src 2>/dev/null | grep -c '</div>' > out.txt"),
               plan("python3", "-c", "print(1/2, 'and/or', 'http://127.0.0.1:8000/a/b')"),
               plan("grep", "-rn", "/api/users", "src")]
    for each in allowed:
        assert response_secrets.command_paths(each) == (), each


def test_a_command_with_relative_paths_and_a_url_is_handed_off_as_usual(short_tmp: Path) -> None:
    """The same rule leaves ordinary commands alone: relative paths, a URL, a regex,
    a division, an HTML closing tag, /dev/null, a route that is no place of the host
    and a script that names no absolute path (V1.43: "不能用面向日志的路径 token 扫描把
    HTML </tag>...误判为可执行路径")."""
    args = [
        "check.py",
        "--out=build/report.txt",
        "--url=http://127.0.0.1:8000/a/b",
        "s/a/b/",
        "1/2",
        "</div>",
        "/dev/null",
        "/api/users",
        "-c",
        "import sys; print(open('src/app.py').read(), 1/2, '</div>', file=sys.stderr)",
    ]
    call = tool_call("command.exec", {"program": "python3", "args": args, "cwd": "src"}, "call-1")
    server = FakeOpenAIServer([Reply(body=completion(None, [call])), Reply(body=completion("ran"))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="run the check")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed", "waiting"})
            assert shown["run"]["status"] != "needs-reconciliation", shown["run"]
            (action,) = ledger_rows(daemon.home, "SELECT tool, input FROM actions")
            assert action["tool"] == "command.exec"
            assert json.loads(action["input"])["args"] == args
        finally:
            daemon.shutdown()


def test_an_invalid_response_holding_a_secret_fails_closed_too(short_tmp: Path) -> None:
    """Seed 004 V1.43, "有效和无效 Provider 响应都必须先做私有内容安全检查": a call the
    catalog does not hold (an invalid plan, which would go back to the model as a
    repair) is checked like a valid one."""
    value = "sk-proj-" + secrets.token_hex(16)
    bad = tool_call("no.such_tool", {"key": value}, "call-1")
    server = FakeOpenAIServer([Reply(body=completion(None, [bad]))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="anything")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
            assert [r["status"] for r in shown["provider_requests"]] == ["needs-reconciliation"]
            assert len(server.requests) == 1, "no repair request carried it back to the model"
            daemon.shutdown()
            assert _files_holding(daemon.home, value) == []
        finally:
            daemon.shutdown()


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("token = get_token()", ()),
        ("api_key = os.environ['API_KEY']", ()),
        ('password = request.form["password"]', ()),
        ("secret_key = settings.SECRET_KEY", ()),
        ("if password == user.password:", ()),
        ("export API_KEY=$OPENAI_API_KEY", ()),
        # Quoted, a variable is still a name: the shell or the config loader fills it in.
        ('export API_KEY="$OPENAI_API_KEY"', ()),
        ('api_key: "${OPENAI_API_KEY}"', ()),
        ("password: '${DB_PASSWORD}'", ()),
        # A parameter's type or default, and a placeholder, are no value either.
        ("def login(user: str, password: str) -> bool:", ()),
        ("def connect(token: str | None = None):", ()),
        ("password=None", ()),
        ("api_key=<your-api-key>", ()),
        # ...but a literal after the type still is one.
        ('password: str = "hunter2hunter2"', ("KeywordDetector", "corral")),
        ("password: hunter2hunter2", ("KeywordDetector", "corral")),
        ('api_key = "q1w2e3r4t5y6u7i8"', ("KeywordDetector", "corral")),
        ("PASSWORD=hunter22abc", ("KeywordDetector", "corral")),
        ("OPENAI = 'sk-proj-AbCdEf0123456789ghIJ'", ("corral",)),
        ("git clone https://bob:s3cretP4ss@git.example.com/app.git", ("BasicAuthDetector", "corral")),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", ("PrivateKeyDetector", "corral")),
        ('{"token": "${API_TOKEN}"}', ()),
    ],
)
def test_code_that_names_a_secret_is_no_secret_value_and_every_value_is(text: str, values: tuple[str, ...]) -> None:
    assert secret_values_in(text) == values
    # The same inside JSON text (a response, a plan): the escapes change nothing.
    assert secret_values_in(json.dumps({"content": text})) == values


@pytest.mark.parametrize("text", [
    '{"db": {"password": "tok_9f8e7d6c5b"}}', '{"api_key": "q1w2e3r4t5y6u7i8"}',
    '{"client_secret": "cs_4c3b2a1z0y"}', '{"access_token": "at_0a9b8c7d6e"}', '{"credential": "cr_5e4d3c2b1a"}',
    "db:\n  password: 'tok_9f8e7d6c5b'\n",
])
def test_a_json_or_yaml_file_holding_a_secret_is_one_raw_and_inside_a_plan(text: str) -> None:
    """V1.43: a file a plan writes that holds a credential by a JSON or YAML key (the
    key's own quote before its colon) is a secret value, as written and inside the
    plan's JSON (a strict re-audit found such a write handed off and stored raw)."""
    assert "corral" in secret_values_in(text)
    assert "corral" in secret_values_in(json.dumps({"actions": [{"tool": "fs.write", "input": {"content": text}}]}))


def test_a_provider_failure_is_stored_without_the_providers_url(tmp_path: Path) -> None:
    """V1.41: the public records (the request row, its event, the run's reason) hold no
    provider URL: a failure names the provider, not where it lives (the URL stays in
    the run's provider settings, which were given by the person who wrote the spec)."""
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
    from corral.supervisor.runs import provider_store, run_store
    from corral.supervisor.runs.run_feature import RunFeatures
    from corral.supervisor.runs.run_state import RunStatus

    features = RunFeatures()
    ledger = SqliteLedger(tmp_path / "l.db")
    try:
        run_id = run_store.create_run(ledger, features, agent_id="writer", task="t", provider="openai",
                                      provider_config={"base_url": "http://10.1.2.3:8080/v1", "model": "m"})
        run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, features)
        error = ("transport error talking to http://10.1.2.3:8080/v1/chat/completions: refused"
                 " (see https://gateway.example/v1/status?k=1)")
        for kind in ("transient", "fatal"):
            slot = provider_store.begin_provider_request(ledger, run_id, 0, features)["slot"]
            provider_store.provider_failed(ledger, run_id, slot, kind, error,
                                           run_store.RunLimits(retry_base_s=0.0, max_provider_retries=1), features)
        stored = json.dumps([dict(row) for row in ledger.all("SELECT * FROM provider_requests")])
        stored += json.dumps([dict(row) for row in ledger.all("SELECT * FROM events")])
        stored += json.dumps([dict(row) for row in ledger.all("SELECT status, reason FROM runs")])
        assert "transport error talking to" in stored, "the failure is still said"
        for url_part in ("10.1.2.3", "8080", "gateway.example", "http://", "https://"):
            assert url_part not in stored, url_part
    finally:
        ledger.close()


def test_a_plan_naming_the_runtimes_home_fails_its_handoff_closed(short_tmp: Path) -> None:
    """V1.43: "命中 ... 配置痕迹 ... 时，handoff 写入失败并进入 reconciliation": a plan
    that names the supervisor's home (its ledger, its spool, its keys: the runtime's
    configuration, the seed's "正式配置路径"), in any field, a file's content too, is
    refused before anything of it is stored."""
    home = short_tmp / "h"
    content = f"state = '{home.resolve()}/ledger.db'\n"
    call = tool_call("fs.write", {"path": "notes.py", "content": content}, "call-1")
    server = FakeOpenAIServer([Reply(body=completion(None, [call]))])
    with serve_in_thread(server) as url:
        daemon = Daemon(home, _spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="note the state")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
            assert "configuration" in shown["run"]["reason"] and str(home) not in shown["run"]["reason"]
            assert ledger_rows(daemon.home, "SELECT response FROM provider_requests")[0]["response"] is None
            assert ledger_rows(daemon.home, "SELECT * FROM actions") == []
            assert not (short_tmp / "ws" / "notes.py").exists()
        finally:
            daemon.shutdown()
    # The same check on its own: a plan that names no home is handed off as before.
    plan = {"actions": [{"tool": "fs.write", "input": {"path": "a.py", "content": "x = 1"}}]}
    traces = response_secrets.config_traces(str(home))
    assert response_secrets.handoff_verdict(json.dumps(plan), json.dumps(plan), plan, traces).handling.value == "store"
    beside = {"actions": [{"tool": "fs.write", "input": {"path": "a.py", "content": f"x = '{home}x/a'"}}]}
    assert response_secrets.plan_verdict(json.dumps(beside), beside, False, traces).handling.value == "store"
    named = {"actions": [{"tool": "fs.write", "input": {"path": "a.py", "content": f"x = '{home}'"}}]}
    assert response_secrets.plan_verdict(json.dumps(named), named, False, traces).config is True
