"""Command lines as the reference guard reads them: segments, words, and the real
program behind wrappers.

A command line is split into segments at ``;``, ``|``, ``&``, ``&&``, ``||`` and
newlines (quotes and backslash escapes respected, ``2>&1`` is a redirection).
In each segment the real program is found behind variable assignments and the
wrappers that run their argument (``sudo``, ``env`` with ``-S``, ``command``,
``nohup``, ``nice``, ``timeout``, ``exec``, ``time``), and shell wrappers
(``sh -c``, ``bash -xec``, ``pwsh -Command``, ``cmd /c``) give up the script they
run. supervisor/intent/intent_classify.py tags what is found.

Pure functions; nothing here touches the filesystem.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: ECMAScript WhiteSpace and LineTerminator: what ``String.prototype.trim`` and
#: ``/\s/`` mean, so corral trims and splits exactly as the reference guard does.
JS_SPACE = frozenset(
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_JS_SPACE_TEXT = "".join(sorted(JS_SPACE))


def js_trim(text: str) -> str:
    return text.strip(_JS_SPACE_TEXT)


# -- lexing ----------------------------------------------------------------------------------


def split_segments(command: str) -> list[str]:
    """Top-level segments, each as written (quotes kept)."""
    segments: list[str] = []
    current: list[str] = []
    quote: str | None = None

    def push() -> None:
        text = js_trim("".join(current))
        if text:
            segments.append(text)
        current.clear()

    index, size = 0, len(command)
    while index < size:
        char = command[index]
        following = command[index + 1:index + 2]
        if quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\" and following:
            current += [char, following]  # an escaped character separates nothing
            index += 2
            continue
        elif quote == '"':
            quote = None if char == '"' else quote
        elif char in "'\"":
            quote = char
        elif char in "\n;|&":
            redirect = char == "&" and ((current and current[-1] in "<>") or following == ">")
            if not redirect and not (char == "|" and current and current[-1] == ">"):
                push()
                index += 2 if char in "|&" and following == char else 1
                continue
        current.append(char)
        index += 1
    push()
    return segments


def tokenize(segment: str) -> list[str]:
    """Words with quotes removed and backslash escapes applied (a backslash before
    anything but a space, a quote, a backslash or an operator is kept, so a
    Windows path survives)."""
    tokens: list[str] = []
    current: list[str] = []
    quote: str | None = None
    index, size = 0, len(segment)
    while index < size:
        char = segment[index]
        following = segment[index + 1:index + 2]
        if quote == "'":
            if char == "'":
                quote = None
            else:
                current.append(char)
        elif quote == '"':
            if char == "\\" and following and following in '"\\$`':
                current.append(following)
                index += 1
            elif char == '"':
                quote = None
            else:
                current.append(char)
        elif char == "\\" and following and (following in JS_SPACE or following in "'\"\\;&|<>"):
            current.append(following)
            index += 1
        elif char in "'\"":
            quote = char
        elif char in JS_SPACE:
            if current:
                tokens.append("".join(current))
                current.clear()
        else:
            current.append(char)
        index += 1
    if current:
        tokens.append("".join(current))
    return tokens


def executable_name(token: str | None) -> str:
    name = (token or "").replace("\\", "/").split("/")[-1].lower()
    return re.sub(r"\.(exe|cmd|bat|ps1)\Z", "", name)


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _drop_assignments(tokens: list[str]) -> None:
    while tokens and _ASSIGNMENT.match(tokens[0]):
        tokens.pop(0)


def _drop_options(tokens: list[str], valued: frozenset[str], *, fold_case: bool = True) -> str | None:
    """Drop a wrapper's options (and their values) from the front; returns the value
    of ``-S``/``--split-string`` when that was one of them (env's command string)."""
    split: str | None = None
    while tokens:
        token = tokens[0]
        if token == "--":
            tokens.pop(0)
            break
        if not token.startswith("-") or token == "-":
            break
        name, _, value = (token.lower() if fold_case else token).partition("=")
        tokens.pop(0)
        takes = name in valued and not value
        joined = len(name) == 2 and len(token) > 2 and "=" not in token  # -n5, -ufoo
        if name in ("-s", "--split-string"):
            if value or joined:
                split = token.partition("=")[2] if value else token[2:]
            elif tokens:
                split = tokens.pop(0)
            continue
        if takes and not joined and tokens:
            tokens.pop(0)
    return split


_SUDO_VALUED = frozenset({"-C", "-D", "-g", "-h", "-p", "-R", "-r", "-T", "-t", "-U", "-u", "--chdir", "--chroot",
                          "--close-from", "--command-timeout", "--group", "--host", "--other-user", "--prompt",
                          "--role", "--type", "--user"})
_ENV_VALUED = frozenset({"-a", "-c", "-s", "-u", "--argv0", "--chdir", "--split-string", "--unset"})
_NICE_VALUED = frozenset({"-n", "--adjustment"})
_TIMEOUT_VALUED = frozenset({"-k", "-s", "--kill-after", "--signal"})
_EXEC_VALUED = frozenset({"-a"})
_TIME_VALUED = frozenset({"-f", "-o", "--format", "--output"})


def unwrap(tokens: list[str]) -> list[str] | None:
    """The tokens from the real program on, or None when the segment only looks a
    program up (``command -v``) or asks a wrapper for help."""
    _drop_assignments(tokens)
    for _ in range(64):
        if not tokens:
            return tokens
        exe = executable_name(tokens[0])
        if tokens[0] == "&":
            tokens.pop(0)
        elif exe == "command":
            tokens.pop(0)
            if tokens and tokens[0] in ("-v", "-V"):
                return None
            _drop_options(tokens, frozenset())
        elif exe == "nohup":
            tokens.pop(0)
            _drop_options(tokens, frozenset())
        elif exe == "sudo":
            tokens.pop(0)
            _drop_options(tokens, _SUDO_VALUED, fold_case=False)
        elif exe == "env":
            tokens.pop(0)
            while tokens and (tokens[0].startswith("-") or _ASSIGNMENT.match(tokens[0])):
                _drop_assignments(tokens)
                split = _drop_options(tokens, _ENV_VALUED) if tokens and tokens[0].startswith("-") else None
                if split is not None:
                    tokens[:0] = tokenize(split)
                    break
        elif exe == "nice":
            tokens.pop(0)
            if tokens and re.fullmatch(r"-\d+", tokens[0]):
                tokens.pop(0)
            _drop_options(tokens, _NICE_VALUED)
        elif exe == "timeout":
            tokens.pop(0)
            if tokens and tokens[0] in ("--help", "--version"):
                return None
            _drop_options(tokens, _TIMEOUT_VALUED)
            if tokens:
                tokens.pop(0)  # the duration
        elif exe == "exec":
            tokens.pop(0)
            _drop_options(tokens, _EXEC_VALUED)
        elif exe == "time":
            tokens.pop(0)
            _drop_options(tokens, _TIME_VALUED)
        else:
            return tokens
        _drop_assignments(tokens)
    return tokens


_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh"})


def wrapped(tokens: Sequence[str]) -> tuple[bool, str | None]:
    """(is a shell, the script it is told to run): ``sh -c SCRIPT``, ``bash -xec
    SCRIPT``, ``pwsh -Command ...``, ``cmd /c ...``. A shell given a script file
    runs what no one can see: (True, None)."""
    exe = executable_name(tokens[0]) if tokens else ""
    args = list(tokens[1:])
    if exe in _SHELLS:
        command_flag = False
        index = 0
        while index < len(args):
            arg = args[index]
            if arg == "--":
                index += 1
                break
            if arg in ("-o", "+o"):
                index += 2
                continue
            if not arg.startswith(("-", "+")) or arg in ("-", "+"):
                break
            if arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]:
                command_flag = True
            index += 1
        if index < len(args):
            return True, args[index] if command_flag else None
        return True, None
    lower = [arg.lower() for arg in args]
    markers = {"pwsh": ("-c", "-command"), "powershell": ("-c", "-command"), "cmd": ("/c", "/k")}.get(exe)
    if markers is None:
        return False, None
    marker = next((i for i, arg in enumerate(lower) if arg in markers), -1)
    if marker >= 0 and marker + 1 < len(args) and args[marker + 1]:
        return True, " ".join(args[marker + 1:])
    return True, None


def first_operand(args: Sequence[str], valued: frozenset[str] = frozenset()) -> tuple[str, int] | None:
    """The first argument that is not an option (skipping the values of ``valued``), lowercased."""
    index = 0
    while index < len(args):
        value = args[index].lower()
        if value == "--":
            return (args[index + 1].lower(), index + 1) if index + 1 < len(args) and args[index + 1] else None
        if not value.startswith("-") or value == "-":
            return value, index
        if "=" not in value and value in valued:
            index += 1
        index += 1
    return None


def subcommand(args: Sequence[str], valued: frozenset[str] = frozenset()) -> tuple[str | None, list[str]]:
    found = first_operand(args, valued)
    return (found[0], list(args[found[1] + 1:])) if found else (None, [])


def option_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    for index, token in enumerate(args):
        if token in names:
            return args[index + 1] if index + 1 < len(args) else None
        for name in names:
            if token.startswith(name + "="):
                return token[len(name) + 1:]
            if len(name) == 2 and token.startswith(name) and len(token) > 2:
                return token[2:]
    return None
