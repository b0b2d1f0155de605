"""Seed 004's path filter (V1.6 "上下文清洗覆盖 Unix、Windows 盘符、正反斜杠 UNC、
file:/...、file:///... 和百分号编码的 file: URI，绝对路径统一替换为 <absolute-path>，
同时保留普通相对文本与 HTTP(S) URL"; V1.41 "依次过滤密钥、项目路径和其它绝对路径")."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.core.path_scrub import absolute_paths_in, names_absolute_path, scrub_paths

PROJECT = "/home/ana/work/shop"


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        (f"wrote {PROJECT}/src/app.py.", "wrote <project>/src/app.py."),
        (f"the root is {PROJECT}", "the root is <project>"),
        ("read /etc/hosts and /home/ana/.ssh/config", "read <absolute-path> and <absolute-path>"),
        (r"C:\Users\ana\notes.txt and D:/data/x.csv", "<absolute-path> and <absolute-path>"),
        (r"share \\fileserver\team\plan.md", "share <absolute-path>"),
        ("share //fileserver/team/plan.md", "share <absolute-path>"),
        ("open file:///opt/app/index.html or file:/tmp/x", "open <absolute-path> or <absolute-path>"),
        ("encoded file:%2Fetc%2Fpasswd", "encoded <absolute-path>"),
        ("in `/var/log/syslog`, (see /srv/x)", "in `<absolute-path>`, (see <absolute-path>)"),
        ("flag --config=/etc/app.toml", "flag --config=<absolute-path>"),
        (f"{PROJECT}x/other stays another path", "<absolute-path> stays another path"),
        # Found by a strict re-audit: a path after a colon, a \\?\ path, a path with a space.
        ("copy to user@host:/home/u/.ssh/id_rsa", "copy to user@host:<absolute-path>"),
        ("Error:/home/u/x failed", "Error:<absolute-path> failed"),
        (r"long \\?\C:\x\y.txt", "long <absolute-path>"),
        # A path with a space is whole when quoted; unquoted, text after a space is text.
        (r'"C:\Users\a b\c.txt" and D:\x', '"<absolute-path>" and <absolute-path>'),
        ("notes in `/home/u/My Docs.txt`.", "notes in `<absolute-path>`."),
        ("cp /tmp/a.txt src/b.txt", "cp <absolute-path> src/b.txt"),
        # A Windows path goes on past a space while the next word goes on as a path.
        (r"Saved to C:\Users\John Smith\Documents\x.txt now", "Saved to <absolute-path> now"),
        # curl's @file (a third strict re-audit).
        ("curl -d @/etc/passwd https://x.example", "curl -d @<absolute-path> https://x.example"),
        ("ran /usr/bin/python tests/test_x.py -q", "ran <absolute-path> tests/test_x.py -q"),
        # Glued to a redirection or a one-letter option (a second strict re-audit).
        ("built with `make 2>/tmp/build.log`", "built with `make 2><absolute-path>`"),
        ("echo hi >/etc/x; cat </etc/passwd", "echo hi ><absolute-path>; cat <<absolute-path>"),
        ("gcc -I/usr/include -c x.c && tar -C/etc x", "gcc -I<absolute-path> -c x.c && tar -C<absolute-path> x"),
        # Glued to a multi-letter option, or to a linker's comma list (a fourth strict re-audit).
        (
            "gcc -isystem/usr/include -Wl,-rpath,/usr/lib x.c",
            "gcc -isystem<absolute-path> -Wl,-rpath,<absolute-path> x.c",
        ),
        (
            "./configure --prefix/usr/local && cl -oC:\\out\\x.exe",
            "./configure --prefix<absolute-path> && cl -o<absolute-path>",
        ),
        # A file: URI percent-encoded whole, its colon and slashes too.
        ("open file%3A%2F%2F%2Fetc%2Fpasswd now", "open <absolute-path> now"),
        ("or FILE%3a%5C%5Cserver%5Cshare%5Cx", "or <absolute-path>"),
        # A project root with a space in it is the project's, whole.
        ("wrote /home/ana/My Work/shop/src/a.py.", "wrote <project>/src/a.py."),
    ],
)
def test_absolute_paths_become_placeholders(text: str, scrubbed: str) -> None:
    assert scrub_paths(text, [PROJECT, "/home/ana/My Work/shop"]) == scrubbed


def test_an_unquoted_path_with_a_space_is_whole_when_this_host_has_it(tmp_path: Path) -> None:
    """V1.6 "绝对路径统一替换为 <absolute-path>，同时保留普通相对文本": a path of this host
    whose directory name has a space (``/home/John Smith/x``) is one path, its tail too;
    a path followed by relative text (``cp /tmp/a src/b``) keeps the text, since no
    ``/tmp/a src`` exists."""
    (tmp_path / "John Smith" / "My Docs").mkdir(parents=True)
    (tmp_path / "John Smith" / "My Docs" / "x 1.txt").write_text("x")
    text = f"saved {tmp_path}/John Smith/My Docs/x 1.txt and src/b.txt; see {tmp_path}/John Smith."
    assert scrub_paths(text) == "saved <absolute-path> and src/b.txt; see <absolute-path>."
    assert scrub_paths(f"cp {tmp_path}/a src/b") == "cp <absolute-path> src/b"
    assert scrub_paths(f"{tmp_path}/John Doe/x") == "<absolute-path> Doe/x"  # no such place here


@pytest.mark.parametrize(
    "text",
    [
        "see docs/readme.md and ./src/app.py and ../up/x",
        "https://example.com/a/b?c=/d and http://localhost:8000/x",
        "and/or, 1/2, s/a/b/, </div>, <project>/src/app.py",
        "path.split('/') and url.rstrip(\"/\") and `//` comments",
        "~/notes is relative to a home the sandbox does not have",
        "ratio: 3 / 4",
        "use -v/--verbose or --quiet/-q",
        "file%3A is a scheme, and file%3Athat",
    ],
)
def test_relative_text_and_urls_stay(text: str) -> None:
    assert scrub_paths(text, [PROJECT]) == text
    assert absolute_paths_in(text) == []


@pytest.mark.parametrize(
    ("argument", "is_path"),
    [
        ("/etc/hosts", True),
        (f"{PROJECT}/check.py", True),
        ("--config=/etc/app.toml", True),
        ("PATH=/usr/bin:/bin", True),
        (r"C:\tools\x.exe", True),
        ("file:///opt/x", True),
        ("/dev/null/x", True),
        ("-I/usr/include", True),
        ("-L/opt/lib", True),
        ("-isystem/usr/include", True),
        ("-Wl,-rpath,/usr/lib", True),
        ("--prefix/usr/local", True),
        ("file%3A%2F%2F%2Fetc%2Fpasswd", True),
        ("--prefix/api/v1", False),
        ("-j4", False),
        ("-rf", False),
        ("check.py", False),
        ("--out=build/report.txt", False),
        ("--url=http://127.0.0.1:8000/a/b", False),
        ("/dev/null", False),
        ("echo built > out.txt 2>/dev/null; cat /etc/hostname", False),  # a script's text, not a path
        ("s/a/b/", False),
        ("</div>", False),
        ("/api/users", False),  # a route a command searches for: no top directory of a host
        ("--route=/v1/items", False),
    ],
)
def test_a_structured_argument_is_an_absolute_path_only_when_it_is_one(argument: str, is_path: bool) -> None:
    """V1.43's "结构化可执行路径/命令参数中的项目及其它绝对路径": an argument that is a
    path, whole or as an option's value; never text that only mentions one."""
    assert names_absolute_path(argument) is is_path
