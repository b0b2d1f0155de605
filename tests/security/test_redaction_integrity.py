"""Issue 14, item 6: redaction applies to what is stored and shown, never to what a
tool acts on. Files full of secret-looking lines (code that names a secret) reach
the disk byte for byte, including after a SIGKILL between the plan and the write.
A plan that holds a secret *value* is never acted on: its handoff fails closed and
nothing of it is stored (seed 004 V1.43, tests/test_provider_secrets.py); the
ledger holds none of the values either way."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from corral.core import failpoints
from corral.core.procs import wait_exit
from tests.harness import ledger_rows, running, wait_run

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAxRedactMe0123456789\n-----END RSA PRIVATE KEY-----"
SECRETS = {
    "openai": "sk-proj-AbCdEf0123456789ghIJklMNop",
    "github": "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2",
    "aws": "AKIAABCDEFGHIJKLMNOP",
    "password": "hunter2hunter2",
    "bearer": "eyJhbGciOiJIUzI1NiJ9.payload.signature",
    "quoted": "q1w2e3r4t5y6u7i8",
}
#: Code that names a secret and holds none: redaction hides it in the ledger, and the
#: tool writes it as the model wrote it.
CODE = "\n".join(
    [
        "import os",
        "token = get_token()",
        "api_key = os.environ['API_KEY']",
        "password = request.form['password']",
        "secret_key = settings.SECRET_KEY",
        "export API_TOKEN=$CI_TOKEN",
        "",
    ]
)
#: Secret values: a plan holding them fails closed.
CONTENT = "\n".join(
    [
        "import os",
        "token = get_token()",
        "api_key = os.environ['API_KEY']",
        f"OPENAI = '{SECRETS['openai']}'",
        f"GITHUB_TOKEN={SECRETS['github']}",
        f"aws_access_key_id = {SECRETS['aws']}",
        f"password: {SECRETS['password']}",
        f'api_key = "{SECRETS["quoted"]}"',
        f"headers = {{'Authorization': 'Bearer {SECRETS['bearer']}'}}",
        PEM,
        "",
    ]
)
NEW_LINE = "secret = load_secret_from_vault()"


def _spec(content: str = CODE) -> tuple[str, str]:
    write = json.dumps({"path": "src/settings.py", "content": content})
    patch = json.dumps(
        {
            "path": "src/settings.py",
            "old_text": "token = get_token()",
            "new_text": NEW_LINE,
            "expected_sha256": hashlib.sha256(content.encode()).hexdigest(),
        }
    )
    steps = json.dumps(
        {
            "steps": [
                {"actions": [{"tool": "fs.write", "input": json.loads(write)}]},
                {"actions": [{"tool": "fs.patch", "input": json.loads(patch)}]},
                {"final": "configured"},
            ]
        }
    )
    return """
[project]
root = "ws"
[[agents]]
id = "writer"
provider = "scripted"
script = "script.json"
""", steps


def _ledger_bytes(home: Path) -> bytes:
    return b"".join(path.read_bytes() for path in home.glob("ledger.db*"))


def _persisted(home: Path) -> bytes:
    """Everything corral persisted, except the private spool (0600 raw copies)."""
    return b"".join(
        path.read_bytes() for path in home.rglob("*") if path.is_file() and "sealed" not in path.parts
    )


@pytest.mark.parametrize(
    "failpoint",
    # Each kill lands where the raw copy must be found again: the response committed
    # but not parsed, the plan committed, the action prepared.
    ["", "provider.after-handoff=kill@once", "plan.after-commit=kill@once", "action.after-prepared=kill@once"],
)
def test_files_full_of_secret_looking_lines_reach_the_disk_byte_for_byte(short_tmp: Path, failpoint: str) -> None:
    spec, script = _spec()
    (short_tmp / "ws").mkdir()
    (short_tmp / "script.json").write_text(script)
    env = {"CORRAL_FAILPOINTS": failpoint} if failpoint else {}
    with running(short_tmp / "home", spec, env=env) as daemon:
        # Read before the run: the failpoint may kill the supervisor before `run` returns.
        pid = daemon.endpoint.pid
        run_id = daemon.call("run", agent_id="writer", task="write the settings")["run_id"]
        if failpoint and failpoint.split("=")[0] not in failpoints.ACTOR_SIDE:
            # A supervisor-side failpoint kills the supervisor: restart it as a person would.
            assert wait_exit(pid, 60)
            daemon.up()
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"}, timeout=90)
        assert shown["run"]["status"] == "completed", shown["run"]
        expected = CODE.replace("token = get_token()", NEW_LINE).encode()
        on_disk = (short_tmp / "ws" / "src" / "settings.py").read_bytes()
        assert on_disk == expected, json.dumps(shown["receipts"])[:3000]
        receipts = ledger_rows(daemon.home, "SELECT tool, status FROM receipts ORDER BY receipt_id")
        assert [(r["tool"], r["status"]) for r in receipts][-2:] == [("fs.write", "ok"), ("fs.patch", "ok")]
        # The checksum the ledger reports is the checksum of the real file.
        patched = ledger_rows(daemon.home, "SELECT result FROM actions WHERE tool = 'fs.patch' AND phase = 'ok'")
        assert json.loads(patched[0]["result"])["output"]["sha256"] == hashlib.sha256(expected).hexdigest()
        daemon.shutdown()
    # Once the run is over, the raw copies are gone too.
    spool = short_tmp / "home" / "sealed"
    assert not spool.exists() or not any(spool.iterdir()) or _swept_on_next_boot(short_tmp)


def test_a_plan_writing_secret_values_is_never_acted_on_and_stores_none_of_them(short_tmp: Path) -> None:
    spec, script = _spec(CONTENT)
    (short_tmp / "ws").mkdir()
    (short_tmp / "script.json").write_text(script)
    with running(short_tmp / "home", spec) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="write the settings")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"}, timeout=90)
        assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
        assert not (short_tmp / "ws" / "src" / "settings.py").exists()
        daemon.shutdown()
    # Everything in the home but the scripted provider's own script (the user's spec,
    # which holds the would-be responses: its raw copy is the run's provider config).
    stored = b"".join(path.read_bytes() for path in (short_tmp / "home").rglob("*")
                      if path.is_file() and ".raw-provider-config." not in path.name)
    for name, value in SECRETS.items():
        assert value.encode() not in stored, name
    assert b"MIIEowIBAAKCAQEAxRedactMe" not in stored


def _swept_on_next_boot(base: Path) -> bool:
    spec, _ = _spec()
    with running(base / "home", spec) as daemon:
        spool = daemon.home / "sealed"
        return not any(spool.iterdir())


# -- issue 32, case 10: AWS secret keys and credentials in URLs --------------------------

#: Each value, the line it comes in, and the bytes that must not reach the ledger
#: (for ``pw`` the credential pair: two letters alone are everywhere).
LEAKS = {
    "aws_secret_access_key = Zq8uV3kP2mX9tR4wY7bN1cL6hJ5gF0dS2aQ8eT3y": b"Zq8uV3kP2mX9tR4wY7bN1cL6hJ5gF0dS2aQ8eT3y",
    "AWS_SECRET_ACCESS_KEY=Kc4nR7vT1pW8yB2mX5zQ9sD3fG6hJ0lA4eU7iO1r": b"Kc4nR7vT1pW8yB2mX5zQ9sD3fG6hJ0lA4eU7iO1r",
    "git clone https://bob:s3cretP4ss@git.example.com/team/app.git": b"s3cretP4ss",
    "psql postgres://admin:Adm1nPw0rd77@db/app": b"Adm1nPw0rd77",
    "DATABASE_URL=postgresql://u:pw@h/db": b"u:pw@h",
}
LEAKY_STEPS = """
[[agents.steps]]
actions = [{ tool = "fs.read", input = { path = "notes/deploy.md" } }]
[[agents.steps]]
final = "read the deploy notes"
"""


def test_aws_keys_and_url_credentials_are_redacted_by_the_maintained_patterns() -> None:
    from corral.core.redact import REDACTED, redact_text

    for line, secret in LEAKS.items():
        shown = redact_text(line)
        assert secret.decode() not in shown and REDACTED in shown, shown
    # What is not secret stays: the user, the host, the variable's name.
    assert redact_text("https://bob:s3cretP4ss@git.example.com/x") == f"https://bob:{REDACTED}@git.example.com/x"
    assert redact_text("AWS_SECRET_ACCESS_KEY=Kc4nR7vT1pW8yB2mX5zQ9sD3fG6hJ0lA4eU7iO1r\nnext") == (
        f"AWS_SECRET_ACCESS_KEY={REDACTED}\nnext"
    )


def test_an_annotated_assignment_of_a_literal_leaves_no_literal() -> None:
    """``password: str = "..."`` in a stored text reply: the keyword rules stopped at the
    type and left the literal itself in the ledger's copy (found by a secret-handling
    review); raw, in a parameter list and inside JSON text alike."""
    from corral.core.redact import redact_text

    literal = "hunter2hunter2"
    for text in (f'password: str = "{literal}"', f'def login(user: str, password: str = "{literal}"):',
                 json.dumps({"text": f'api_key: Optional[str] = "{literal}"'})):
        assert literal not in redact_text(text), text
    # A quoted variable is no value: the name of the variable stays readable.
    assert "DB_PASSWORD" in redact_text('password: str = "${DB_PASSWORD}"')


def test_a_recurring_text_is_redacted_each_time_and_a_secret_registered_later_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Short texts' spans are remembered (redact.py ``_recurring_spans``): the second
    sight of a text is redacted like the first, long texts alike, and a value
    registered as secret after a text was first seen is redacted in it next time."""
    from corral.core import redact

    monkeypatch.setattr(redact, "_extra_values", set())  # this process's registry, restored after
    short = "token = Kc4nR7vT1pW8yB2mX5zQ9sD3"
    long = short + " " + "x" * redact.RECURRING_MAX_CHARS
    for text in (short, long):
        first, second = redact.redact_text(text), redact.redact_text(text)
        assert first == second and "Kc4nR7vT1pW8yB2mX5zQ9sD3" not in second and redact.REDACTED in second
    plain = "deploy with rotation-value-7781 now"
    assert redact.redact_text(plain) == plain
    redact.register_secret("rotation-value-7781")
    assert redact.redact_text(plain) == f"deploy with {redact.REDACTED} now"


def test_every_detect_secrets_pattern_plugin_is_applied() -> None:
    """The pattern set is detect-secrets' own: every regex plugin it ships (but the
    public-IP one) gives rules, read from the installed package."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    from corral.core import secret_rules

    expected = {plugin.__name__ for plugin in get_mapping_from_secret_type_to_class().values()
                if issubclass(plugin, RegexBasedDetector)} - {"IPPublicDetector"}
    sources = {rule.source for rule in secret_rules.plugin_rules()}
    assert expected <= sources and "KeywordDetector" in sources
    assert {"AWSKeyDetector", "BasicAuthDetector", "PrivateKeyDetector", "GitHubTokenDetector", "SlackDetector",
            "StripeDetector"} <= sources


def test_a_fork_server_takes_the_supervisors_rules_unchanged() -> None:
    """A fork server takes its rules from the supervisor's init message (msgpack,
    sandbox/launcher.py), not from detect-secrets: what arrives builds the same
    families, in the same order, with the same needles, so its actors redact as the
    supervisor does."""
    import msgpack

    from corral.core import redact, secret_rules

    sent = msgpack.packb({"redaction": redact.exported()}, use_bin_type=True)
    taken = redact._plan_of(secret_rules.from_wire(msgpack.unpackb(sent, raw=False)["redaction"]))
    built = redact._plan()
    assert taken.families == built.families and taken.needles == built.needles
    assert sum(len(family.rules) for family in taken.families) > 50


def test_a_tool_output_with_aws_keys_and_url_credentials_leaves_none_in_the_ledger(short_tmp: Path) -> None:
    """A live run reads a file full of them; the ledger's bytes on disk (the database
    and its WAL) hold none, and the file itself is read whole (the model sees it)."""
    from tests.harness import agent_spec

    notes = short_tmp / "ws" / "notes"
    notes.mkdir(parents=True)
    (notes / "deploy.md").write_text("# deploy\n" + "\n".join(LEAKS) + "\n")
    with running(short_tmp / "home", agent_spec(steps=LEAKY_STEPS)) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="read the deploy notes")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        results = ledger_rows(daemon.home, "SELECT result FROM actions WHERE run_id = ? AND tool = 'fs.read'", run_id)
        stored = results[0]["result"]
        assert len(results) == 1 and "[redacted]" in stored and "postgres://admin:" in stored
        ledger = _ledger_bytes(daemon.home)  # while it runs: the WAL holds the newest pages
        daemon.shutdown()
    ledger += _ledger_bytes(short_tmp / "home")
    assert ledger, "the ledger is on disk"
    for line, secret in LEAKS.items():
        assert secret not in ledger, line


# -- issue 48, D.16: credentials in URLs of every scheme ------------------------------------

#: Each line, and the password that must not reach the ledger. The user name stays
#: readable (docs/security.md: "A URL's user name is kept").
URL_LEAKS = {
    "cache: redis://user:pass@cache.internal:6379/0": b"user:pass@",
    "broker: redis://:R3dis0nlyPw@cache.internal:6379": b"R3dis0nlyPw",
    "queue: amqp://guest:Amqp$ecret99@mq.internal:5672/vhost": b"Amqp$ecret99",
    "db: mongodb+srv://admin:M0ngo@pw&x!7@cluster0.example.net/app?retryWrites=true": b"M0ngo@pw&x!7",
    "files: ftp://anon:Ftp;Pass=77@ftp.example.org/pub": b"Ftp;Pass=77",
    "mine: x-corral-made.up+v2://svc:Made(Up)Pw42@svc.internal:9/": b"Made(Up)Pw42",
}


def test_url_credentials_of_every_scheme_leave_none_in_the_ledger(short_tmp: Path) -> None:
    """A live run reads the URLs in a tool's result (fs.read), then plans to write them
    (fs.write): the read is redacted in the ledger, the plan holding them fails closed
    (seed 004 V1.43), and the ledger's bytes hold no password, whatever the scheme or
    the characters in it."""
    from tests.harness import agent_spec

    text = "\n".join(URL_LEAKS) + "\n"
    (short_tmp / "ws").mkdir()
    (short_tmp / "ws" / "urls.txt").write_text(text)
    steps = (
        "[[agents.steps]]\n"
        "actions = [{ tool = \"fs.read\", input = { path = \"urls.txt\" } }]\n"
        "[[agents.steps]]\n"
        f"actions = [{{ tool = \"fs.write\", input = {{ path = \"copy.txt\", content = {json.dumps(text)} }} }}]\n"
        "[[agents.steps]]\n"
        "final = \"noted the URLs\"\n"
    )
    with running(short_tmp / "home", agent_spec(steps=steps)) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="note the service URLs")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
        rows = ledger_rows(daemon.home, "SELECT tool, input, result FROM actions WHERE run_id = ? ORDER BY 1", run_id)
        stored = {row["tool"]: row for row in rows}
        assert set(stored) == {"fs.read"}, "the plan writing the passwords was never prepared"
        # What is not secret stays readable: the scheme, the user and the host.
        assert "redis://:[redacted]@cache.internal" in stored["fs.read"]["result"], stored["fs.read"]["result"]
        ledger = _ledger_bytes(daemon.home)  # while it runs: the WAL holds the newest pages
        daemon.shutdown()
    ledger += _ledger_bytes(short_tmp / "home")
    assert not (short_tmp / "ws" / "copy.txt").exists()
    for line, secret in URL_LEAKS.items():
        assert secret not in ledger, line
