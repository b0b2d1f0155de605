"""Output sanitizing: control sequences, secrets, absolute paths."""

from __future__ import annotations

import pytest

from corral.actors.incremental_sanitize import IncrementalSanitizer
from corral.actors.sanitize import redact_paths, sanitize_output, strip_controls
from corral.core.redact import REDACTED

ROOTS = {"<project>": "/srv/proj", "<home>": "/home/alice"}


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("\x1b[31mred\x1b[0m plain", "red plain"),
        ("\x1b[1;38;5;196mbold\x1b[m", "bold"),
        ("\x1b[2J\x1b[Hcleared", "cleared"),
        ("\x1b[?25lcursor\x1b[?25h", "cursor"),
        ("\x1b]0;window title\x07after", "after"),
        ("\x1b]8;;https://x.test\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("\x1bPq#0;2;0;0;0\x1b\\dcs", "dcs"),
        ("\x1b(Bcharset \x1b7saved\x1b8", "charset saved"),
        ("\x9b31m8-bit csi", "8-bit csi"),
        ("trailing escape \x1b", "trailing escape "),
        ("unterminated \x1b]0;title", "unterminated "),
    ],
)
def test_escape_sequences_are_removed(raw: str, clean: str) -> None:
    assert strip_controls(raw) == clean


def test_c0_controls_except_newline_and_tab() -> None:
    raw = "a\tb\nc\x00d\x07e\x08f\x0bg\x0ch\x7fi\x1aj"
    assert strip_controls(raw) == "a\tb\ncdefghij"


def test_crlf_becomes_lf_and_lone_cr_is_dropped() -> None:
    assert strip_controls("one\r\ntwo\r\n") == "one\ntwo\n"
    assert strip_controls("10%\r20%\r") == "10%20%"


def test_bidi_overrides_are_removed() -> None:
    assert strip_controls("access\u202e\u2066denied\u2069") == "accessdenied"


def test_secrets_are_redacted() -> None:
    text = "key=sk-abcdefghijklmnopqrstuvwx and Authorization: Bearer abcdefghijklmnop"
    out = sanitize_output(text)
    assert "sk-abcdef" not in out and "abcdefghijklmnop" not in out
    assert out.count(REDACTED) == 2


def test_secret_split_by_escape_sequence_is_still_redacted() -> None:
    out = sanitize_output("token sk-abcdefgh\x1b[0mijklmnopqrstuv end")
    assert "sk-" not in out
    assert out == f"token {REDACTED} end"


def test_env_secret_values_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "hunter2-very-secret")
    assert sanitize_output("pw is hunter2-very-secret!") == f"pw is {REDACTED}!"


def test_paths_under_roots_get_placeholders() -> None:
    text = "edit /srv/proj/src/app.py, see /home/alice/.config/x and /srv/proj."
    assert redact_paths(text, ROOTS) == (
        "edit <project>/src/app.py, see <home>/.config/x and <project>."
    )


def test_paths_only_match_whole_components() -> None:
    text = "/srv/project2/x /srv/proj.bak /x/srv/proj/y /home/alicia"
    assert redact_paths(text, ROOTS) == text


def test_longest_root_wins() -> None:
    roots = {"<home>": "/home/alice", "<project>": "/home/alice/work/p"}
    assert redact_paths("/home/alice/work/p/a /home/alice/b", roots) == "<project>/a <home>/b"


def test_several_spellings_of_one_root() -> None:
    roots = [("<project>", "/srv/proj"), ("<project>", "/mnt/real/proj")]
    assert redact_paths("/mnt/real/proj/a /srv/proj/b", roots) == "<project>/a <project>/b"


def test_root_slash_is_ignored() -> None:
    assert redact_paths("/etc/passwd", {"<root>": "/"}) == "/etc/passwd"


def test_sanitize_is_pure_and_idempotent() -> None:
    raw = "\x1b[32mok\x1b[0m /srv/proj/a sk-abcdefghijklmnopqrstuv\r\n"
    once = sanitize_output(raw, ROOTS)
    assert once == sanitize_output(raw, ROOTS)
    assert sanitize_output(once, ROOTS) == once
    assert once == f"ok <project>/a {REDACTED}\n"


def test_plain_text_is_unchanged() -> None:
    text = "hello wörld ✓ 12:30 a/b\n\ttabbed\n"
    assert sanitize_output(text, ROOTS) == text


def test_large_input_stays_linear() -> None:
    # A pathological line (escape introducers without terminators) must not blow up.
    text = ("\x1b[" + "1;" * 50 + "x") * 2000 + "\x1b]" + "a" * 100_000
    assert sanitize_output(text) == ""


class TestIncremental:
    """Chunked feeding gives what sanitizing the whole output would."""

    def _feed_all(self, data: bytes, size: int) -> str:
        sanitizer = IncrementalSanitizer(ROOTS)
        out = [sanitizer.feed(data[start : start + size]) for start in range(0, len(data), size)]
        out.append(sanitizer.finish())
        return "".join(out)

    @pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
    def test_chunked_equals_whole(self, size: int) -> None:
        data = (
            "\x1b[31mred\x1b[0m wörld\r\n"
            "path /srv/proj/src/main.py\r\n"
            "\x1b]0;title\x07prompt> "
        ).encode()
        assert self._feed_all(data, size) == sanitize_output(data.decode(), ROOTS)

    def test_private_key_split_across_chunks_is_redacted(self) -> None:
        key = (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nabcdef\n"
            "-----END RSA PRIVATE KEY-----\n"
        )
        out = self._feed_all(("before\n" + key + "after\n").encode(), 5)
        assert "MIIE" not in out
        assert out == f"before\n{REDACTED}\nafter\n"

    def test_partial_line_is_published_on_flush(self) -> None:
        sanitizer = IncrementalSanitizer(None)
        assert sanitizer.feed(b"Password: ") == ""
        assert sanitizer.flush() == "Password: "

    def test_flush_holds_an_unfinished_escape_and_utf8(self) -> None:
        sanitizer = IncrementalSanitizer(None)
        sanitizer.feed(b"abc\x1b[3")
        assert sanitizer.flush() == "abc"
        sanitizer.feed(b"1mred \xc3")
        assert sanitizer.flush() == "red "
        assert sanitizer.feed(b"\xa9\n") == "\u00e9\n"
        assert sanitizer.finish() == ""
        assert sanitizer.has_pending is False

    def test_pending_is_bounded(self) -> None:
        sanitizer = IncrementalSanitizer(None, max_pending=1024)
        out = sanitizer.feed(b"-----BEGIN " + b"x" * 5000)
        assert len(out) > 4000
