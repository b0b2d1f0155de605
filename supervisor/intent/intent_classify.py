"""Action tags: what a proposed action is, in the reference guard's vocabulary.

The tags are the ones seed 000's guard (execution-fidelity-guard 0.2.2) gives a
hook event, so a contract's ``action:<tag>`` rule means the same in corral and
upstream: ``read``, ``write_workspace``, ``install_local``, ``network``,
``publish``, ``external_side_effect``, ``delete``, ``destructive`` and
``unknown``; corral adds ``delegate`` for work handed to another run.

A command line is split into segments, and in each the real program is found
behind assignments and wrappers (supervisor/intent/intent_shell.py); shell wrappers
(``sh -c``, ``bash -xec``, ``pwsh -Command``, ``cmd /c``) are looked into, and
the first matching family wins: install, dependency removal, publish, external,
delete, write, git, read, network. Other tools are tagged by name. Upstream's
own tests define the behaviour; tests/intent/vectors.json pins it.

Pure functions; nothing here touches the filesystem.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.supervisor.intent.intent_shell import (
    executable_name,
    first_operand,
    js_trim,
    option_value,
    split_segments,
    subcommand,
    tokenize,
    unwrap,
    wrapped,
)

HIGH_RISK = frozenset({"delete", "destructive", "install_local", "publish", "external_side_effect"})
#: What cannot be undone by the workspace alone (upstream 0.2.2: writes included).
IRREVERSIBLE = HIGH_RISK | {"write_workspace"}
#: Wrappers are looked through this many times at most (a shell in a shell ...).
MAX_DEPTH = 8

INSTALL = frozenset({"install_local", "write_workspace", "network"})
PUBLISH = frozenset({"publish", "external_side_effect", "network"})
EXTERNAL = frozenset({"external_side_effect", "network"})
DELETE = frozenset({"delete", "destructive"})
WRITE = frozenset({"write_workspace"})
READ = frozenset({"read"})
UNKNOWN = frozenset({"unknown"})


@dataclass(frozen=True)
class Action:
    tool: str
    #: The command line as text (commands only, else ""): what ``command-prefix:`` sees.
    command: str
    tags: tuple[str, ...]

    @property
    def high_risk(self) -> bool:
        return any(tag in HIGH_RISK for tag in self.tags)

    @property
    def reversible(self) -> bool:
        return not any(tag in IRREVERSIBLE for tag in self.tags)


# -- the families ----------------------------------------------------------------------------

_NPM_VALUED = frozenset({"-w", "--cache", "--config", "--prefix", "--registry", "--scope", "--userconfig",
                         "--workspace", "--loglevel"})
_PNPM_VALUED = _NPM_VALUED | {"-c", "-f", "--dir", "--filter", "-C"}
_YARN_VALUED = _NPM_VALUED | {"--cwd"}
_PIP_VALUED = frozenset({"--cache-dir", "--cert", "--client-cert", "--exists-action", "--log", "--proxy", "--python",
                         "--retries", "--timeout", "--trusted-host", "--index-url", "-i", "--extra-index-url",
                         "--find-links", "-f", "--constraint", "-c", "--requirement", "-r", "--target", "-t",
                         "--root", "--prefix", "--src", "--progress-bar"})
_UV_VALUED = frozenset({"--cache-dir", "--config-file", "--directory", "--project", "--python", "-p", "--color",
                        "--index-url", "--extra-index-url"})
_POETRY_VALUED = frozenset({"-c", "-p", "-C", "--directory", "--project"})
_SYSTEM_VALUED = frozenset({"--config-file", "--option", "--target-release", "-c", "-o", "-t", "--color", "-C",
                            "--manifest-path", "--root", "--index", "--registry", "--config"})
#: (package manager, subcommands that install or update dependencies).
_INSTALLS: dict[str, frozenset[str]] = {
    "npm": frozenset({"install", "i", "ci", "link", "exec", "x", "create", "add", "update", "up", "upgrade",
                      "rebuild", "audit-fix", "init"}),
    "pnpm": frozenset({"install", "add", "i", "create", "update", "up", "upgrade", "rebuild", "dlx", "audit-fix"}),
    "yarn": frozenset({"install", "add", "create", "up", "upgrade", "dlx", "global-add", "global-upgrade"}),
    "bun": frozenset({"install", "add", "i", "create", "update", "x"}),
    "uv": frozenset({"sync", "run", "add", "pip-install", "tool-install", "lock"}),
    "poetry": frozenset({"install", "add", "update", "lock"}),
    "pipenv": frozenset({"", "install", "sync", "update", "lock"}),
    "bundle": frozenset({"install", "update", "add"}),
    "gem": frozenset({"install", "update"}),
    "cargo": frozenset({"install", "add", "update"}),
    "go": frozenset({"install", "get"}),
    "conda": frozenset({"install", "update", "upgrade"}),
    "mamba": frozenset({"install", "update", "upgrade"}),
    "brew": frozenset({"install", "upgrade", "reinstall"}),
    "winget": frozenset({"install", "upgrade"}),
    "choco": frozenset({"install", "upgrade"}),
    "scoop": frozenset({"install", "update"}),
    "apt": frozenset({"install", "upgrade", "full-upgrade", "dist-upgrade", "reinstall"}),
    "apt-get": frozenset({"install", "upgrade", "dist-upgrade", "reinstall"}),
    "dnf": frozenset({"install", "update", "upgrade", "reinstall"}),
    "yum": frozenset({"install", "update", "upgrade", "reinstall"}),
    "dotnet": frozenset({"tool-install", "tool-update", "add-package", "restore"}),
    "pipx": frozenset({"install", "run", "upgrade", "reinstall", "inject"}),
    "corepack": frozenset({"install", "prepare", "use", "enable"}),
}
_REMOVALS: dict[str, frozenset[str]] = {
    "npm": frozenset({"uninstall", "remove", "rm", "un", "unlink", "prune"}),
    "pnpm": frozenset({"remove", "rm", "uninstall", "un", "unlink", "prune"}),
    "yarn": frozenset({"remove", "global-remove"}),
    "bun": frozenset({"remove", "rm"}),
    "uv": frozenset({"remove", "pip-uninstall"}),
    "poetry": frozenset({"remove"}),
    "pipenv": frozenset({"uninstall"}),
    "cargo": frozenset({"remove", "uninstall"}),
    "gem": frozenset({"uninstall"}),
    "dotnet": frozenset({"tool-uninstall", "remove-package"}),
    "pipx": frozenset({"uninstall"}),
    "pip": frozenset({"uninstall"}),
    "conda": frozenset({"remove", "uninstall"}),
    "brew": frozenset({"uninstall", "remove"}),
    "apt": frozenset({"remove", "purge", "autoremove"}),
    "apt-get": frozenset({"remove", "purge", "autoremove"}),
    "dnf": frozenset({"remove"}),
    "yum": frozenset({"remove"}),
}
_VALUED_BY_MANAGER = {"npm": _NPM_VALUED, "pnpm": _PNPM_VALUED, "yarn": _YARN_VALUED, "bun": _NPM_VALUED,
                      "uv": _UV_VALUED, "poetry": _POETRY_VALUED}
#: A manager verb that takes a second word: ``yarn global add``, ``dotnet tool install``.
_TWO_WORD = {"yarn": ("global",), "dotnet": ("tool", "add", "remove"), "uv": ("pip", "tool"), "npm": ("audit",),
             "pnpm": ("audit",)}


def _manager_verb(exe: str, tokens: Sequence[str]) -> str | None:
    """A package manager's verb (two words joined by '-' where it takes two)."""
    args = list(tokens[1:])
    found = first_operand(args, _VALUED_BY_MANAGER.get(exe, _SYSTEM_VALUED))
    if found is None:
        return "" if exe == "pipenv" else None
    verb, rest = found[0], args[found[1] + 1:]
    if verb in _TWO_WORD.get(exe, ()):
        second = first_operand(rest, _PIP_VALUED)
        if verb == "audit":
            return "audit-fix" if "fix" in [a.lower() for a in rest] or "--fix" in [a.lower() for a in rest] else verb
        return f"{verb}-{second[0]}" if second else verb
    return verb


def _python_pip(tokens: Sequence[str]) -> str | None:
    """The pip verb of ``python -m pip VERB`` (also ``$py -m pip``, ``python3.11``):
    "" without a verb, None when the segment does not run pip as a module."""
    args = [token.lower() for token in tokens[1:]]
    exe = executable_name(tokens[0]) if tokens else ""
    if not (exe == "py" or re.fullmatch(r"python(?:3(?:\.\d+)?)?", exe) or (tokens and tokens[0].startswith("$"))):
        return None
    if "-m" not in args:
        return None
    at = args.index("-m")
    if args[at + 1:at + 2] != ["pip"]:
        return None
    found = first_operand(args[at + 2:], _PIP_VALUED)
    return found[0] if found else ""


def _package_family(tokens: Sequence[str]) -> frozenset[str] | None:
    exe = executable_name(tokens[0]) if tokens else ""
    lower = [token.lower() for token in tokens[1:]]
    pip_verb = _python_pip(tokens)
    if pip_verb is None and re.fullmatch(r"pip(?:3(?:\.\d+)?)?", exe):
        found = first_operand(lower, _PIP_VALUED)
        pip_verb = found[0] if found else ""
    if pip_verb is not None:
        if pip_verb in ("install", "download", "wheel"):
            return INSTALL
        return WRITE if pip_verb == "uninstall" else None
    if exe in ("npx", "uvx", "bunx", "pnpx", "install-package", "install-module", "update-module", "install-script"):
        return INSTALL
    if (exe == "codex" and (lower[:2] == ["plugin", "add"] or lower[:3] == ["plugin", "marketplace", "add"])) or (
        exe == "dsh" and lower[:2] == ["plugin", "add"]
    ):
        return INSTALL
    if exe in _INSTALLS or exe in _REMOVALS:
        verb = _manager_verb(exe, tokens)
        if verb is None:
            return None
        if verb in _INSTALLS.get(exe, ()):
            return INSTALL
        if verb in _REMOVALS.get(exe, ()):
            return WRITE
    return None


_GIT_VALUED = frozenset({"-c", "--config-env", "--exec-path", "--git-dir", "--namespace", "--super-prefix",
                         "--work-tree"})
_GH_VALUED = frozenset({"-r", "--hostname", "--repo"})
_GH_NOUNS = frozenset({"gist", "issue", "pr", "release", "repo", "run", "secret", "variable", "workflow", "label",
                       "project", "cache", "ruleset"})
#: gh <noun> <verb> pairs that change something remote without publishing a release.
_GH_EXTERNAL = {
    "pr": {"merge", "close", "reopen", "ready", "review", "comment", "edit", "lock", "unlock"},
    "issue": {"close", "reopen", "pin", "unpin", "lock", "unlock", "transfer", "comment", "edit", "delete",
              "develop"},
    "release": {"upload", "delete-asset", "edit"},
    "repo": {"archive", "unarchive", "rename", "sync", "fork", "set-default"},
    "secret": {"delete", "remove", "set"},
    "variable": {"delete", "remove", "set"},
    "run": {"cancel", "delete", "rerun"},
    "workflow": {"run", "enable", "disable"},
    "label": {"create", "edit", "delete", "clone"},
    "cache": {"delete"},
}


def _method_tags(method: str | None, body: bool) -> frozenset[str] | None:
    """An HTTP call that changes something remote: external (a DELETE also deletes)."""
    method = (method or "").lower()
    if method == "delete":
        return EXTERNAL | DELETE
    if method in ("post", "put", "patch", "merge"):
        return EXTERNAL
    if method in ("get", "head", "options") or not body:
        return None
    return EXTERNAL


def _http_family(exe: str, tokens: Sequence[str]) -> frozenset[str] | None:
    args = list(tokens[1:])
    if exe == "curl":
        method = option_value(args, ("-X", "--request"))
        if "-G" in args or "--get" in args:
            return _method_tags(method, False)
        body = any(arg.split("=", 1)[0] in ("-d", "--data", "--data-raw", "--data-binary", "--data-urlencode",
                                            "--data-ascii", "--json", "-F", "--form", "--form-string", "-T",
                                            "--upload-file")
                   or (len(arg) > 2 and arg[:2] in ("-d", "-F", "-T") and not arg.startswith("--"))
                   for arg in args)
        return _method_tags(method, body)
    if exe == "wget":
        lower = [arg.lower() for arg in args]
        method = option_value(lower, ("--method",))
        body = any(arg.split("=", 1)[0] in ("--post-data", "--post-file", "--body-data", "--body-file")
                   for arg in lower)
        return _method_tags(method or ("post" if body and method is None else None), body)
    if exe in ("invoke-webrequest", "invoke-restmethod", "iwr", "irm"):
        lower = [arg.lower() for arg in args]
        method = option_value(lower, ("-method",))
        body = any(arg in ("-body", "-infile", "-form") for arg in lower)
        return _method_tags(method, body)
    return None


def _git_family(args: Sequence[str]) -> frozenset[str]:
    lower = [arg.lower() for arg in args]
    verb, rest = subcommand(lower, _GIT_VALUED)
    nested, _ = subcommand(rest)
    if verb == "push":
        deletes = "--delete" in rest or "-d" in rest or any(arg.startswith(":") and len(arg) > 1 for arg in rest)
        return PUBLISH | DELETE if deletes else PUBLISH
    if (
        verb in ("rm", "clean")
        or (verb == "reset" and "--hard" in rest)
        or (verb == "branch" and ("-d" in rest or "--delete" in rest))
        or (verb == "tag" and ("-d" in rest or "--delete" in rest))
        or (verb == "stash" and nested in ("drop", "clear"))
        or (verb == "worktree" and nested in ("remove", "prune"))
    ):
        return DELETE
    if verb == "branch":
        listing = {"--list", "-l", "--show-current", "-a", "--all", "-r", "--remotes", "-v", "-vv", "--verbose",
                   "--contains", "--no-contains", "--merged", "--no-merged", "--points-at", "--format", "--sort",
                   "--column", "--no-column"}
        options = {arg.split("=", 1)[0] for arg in rest if arg.startswith("-")}
        return READ if not rest or options & listing or (not first_operand(rest) and not options) else WRITE
    if verb == "stash":
        return READ if nested in ("list", "show") else WRITE
    if verb == "worktree":
        return READ if nested == "list" else WRITE
    if verb == "remote":
        return READ if nested in (None, "show", "get-url") else WRITE
    if verb == "tag":
        return READ if not rest or {"-l", "--list"} & set(rest) else WRITE
    if verb in ("status", "diff", "log", "show", "rev-parse", "ls-files", "blame", "grep", "describe", "shortlog",
                "cat-file", "ls-tree", "show-ref", "rev-list", "reflog", "whatchanged", "version", "help"):
        return READ
    if verb in ("add", "am", "apply", "checkout", "cherry-pick", "commit", "merge", "rebase", "restore", "revert",
                "switch", "reset", "mv", "pull", "init", "clone", "fetch", "notes", "submodule", "config"):
        return WRITE
    return UNKNOWN


_WRITERS = frozenset({"add-content", "copy-item", "cp", "mkdir", "move-item", "mv", "new-item", "set-content", "tee",
                      "touch", "out-file", "clear-content", "rename-item", "export-csv", "export-clixml",
                      "start-transcript", "ln", "chmod", "chown", "chgrp", "truncate", "patch", "install", "rsync",
                      "unzip", "tar", "mkfifo", "mknod", "link", "symlink", "set-itemproperty", "new-itemproperty"})
_READS = frozenset({"cat", "dir", "find", "get-childitem", "get-content", "get-filehash", "get-item", "head", "ls",
                    "pwd", "resolve-path", "rg", "sed", "select-string", "tail", "test-path", "where", "where.exe",
                    "grep", "wc", "stat", "file", "less", "more", "tree", "du", "df", "echo", "printf", "which",
                    "diff", "cmp", "sort", "uniq", "cut", "awk", "jq", "write-output", "get-process", "realpath",
                    "readlink", "basename", "dirname", "true", "false", "test", "[", "date", "whoami", "id", "env",
                    "printenv", "uname", "hostname", "sha256sum", "md5sum"})
_HELP = frozenset({"--help", "-h", "--version", "-?"})


def _writes(exe: str, tokens: Sequence[str], segment: str) -> bool:
    args = [token.lower() for token in tokens[1:]]
    if exe in _WRITERS:
        return not (any(arg in _HELP for arg in args) or (exe == "patch" and "--dry-run" in args))
    if exe == "dd":
        return any(arg.startswith("of=") for arg in args)
    if exe == "sed" and any(a == "-i" or (a.startswith("-i") and not a.startswith("--")) or a == "--in-place"
                            or a.startswith("--in-place=") for a in args):
        return True
    return _redirects_output(segment)


def _redirects_output(segment: str) -> bool:
    """Output sent to a file: ``>``, ``>>``, ``>|``, ``&>``, not ``2>&1``, not inside quotes."""
    quote: str | None = None
    index, size = 0, len(segment)
    while index < size:
        char = segment[index]
        if quote is not None:
            if char == "\\" and quote == '"':
                index += 2
                continue
            if char == quote:
                quote = None
        elif char == "\\":
            index += 2
            continue
        elif char in "'\"":
            quote = char
        elif char == ">":
            target = segment[index + 1:].lstrip(">|")
            if not target.startswith("&") and not js_trim(target).startswith("/dev/null"):
                return True
        index += 1
    return False


def _segment_tags(segment: str, depth: int = 0) -> frozenset[str]:
    unwrapped = unwrap(tokenize(segment))
    if unwrapped is None:
        return READ  # `command -v npm`: a lookup, nothing runs
    tokens = unwrapped
    exe = executable_name(tokens[0]) if tokens else ""
    if not exe:
        return frozenset()
    shell, script = wrapped(tokens)
    if shell:
        if script is None or depth >= MAX_DEPTH:
            return UNKNOWN  # a script file, or a wrapper too deep to follow
        nested = frozenset().union(*(_segment_tags(part, depth + 1) for part in split_segments(script)))
        return nested or UNKNOWN
    family = _package_family(tokens)
    if family is not None:
        return family
    args = [token.lower() for token in tokens[1:]]
    if exe == "git":
        verb = subcommand(args, _GIT_VALUED)[0]
        if verb == "push":
            return _git_family(tokens[1:])
    if exe == "npm" and subcommand(args, _NPM_VALUED)[0] in ("publish", "unpublish", "deprecate"):
        return PUBLISH
    if exe == "gh":
        noun, rest = subcommand(args, _GH_VALUED)
        verb = subcommand(rest, _GH_VALUED)[0] if noun in _GH_NOUNS else None
        if noun in ("repo", "release", "pr", "issue", "gist") and verb in ("create", "edit", "delete"):
            return PUBLISH | DELETE if verb == "delete" else PUBLISH
        if noun in _GH_EXTERNAL and verb in _GH_EXTERNAL[noun]:
            return EXTERNAL | DELETE if verb in ("delete", "delete-asset") else EXTERNAL
        if noun == "api":
            method = option_value(rest, ("-x", "--method"))
            body = any(value == option or value.startswith(option + "=")
                       or (option == "-f" and value.startswith("-f") and len(value) > 2)
                       for value in rest for option in ("-f", "--field", "--input", "--raw-field"))
            found = _method_tags(method, body if not method else False)
            if found is not None:
                return found
    http = _http_family(exe, tokens)
    if http is not None:
        return http
    if (
        exe in ("rm", "rmdir", "del", "erase", "remove-item", "shred", "unlink")
        or (exe == "find" and ("-delete" in args or ("-exec" in args and "rm" in args)))
    ):
        return DELETE
    if exe == "git":
        found = _git_family(tokens[1:])
        if found == DELETE:
            return found
    if _writes(exe, tokens, segment):
        return WRITE
    if exe == "git":
        return _git_family(tokens[1:])
    if exe in _READS:
        return READ
    if exe in ("curl", "wget", "invoke-webrequest", "invoke-restmethod", "irm", "iwr", "ssh", "scp", "nc"):
        return frozenset({"network"})
    return UNKNOWN


def command_tags(command: str) -> set[str]:
    tags: set[str] = set()
    for segment in split_segments(command):
        tags |= _segment_tags(segment)
    return tags


_NAMED_READS = frozenset({"create_goal", "get_goal", "list_agents", "update_goal", "update_plan", "wait_agent"})
_READ_VERBS = ("read", "get", "list", "view", "search", "find", "open", "status", "capture", "fetch", "describe",
               "query", "show", "lookup", "check", "count", "wait", "inspect")
_DELETE_VERBS = frozenset({"delete", "remove", "archive", "uninstall", "destroy", "drop", "purge", "erase",
                           "revoke"})
_WRITE_VERBS = frozenset({"write", "save"})
_EXTERNAL_VERBS = frozenset({"create", "update", "send", "publish", "push", "handoff", "share", "install", "consume",
                             "redeem", "set", "add", "post", "reply", "merge", "move", "rename", "fork", "cancel",
                             "close", "reopen", "approve", "restore", "upload", "submit", "edit", "put", "patch",
                             "comment", "assign", "invite", "transfer", "deploy", "trigger", "execute", "run",
                             "start", "stop", "enable", "disable", "upsert", "insert", "modify", "reorder", "pin",
                             "unpin", "lock", "unlock", "star", "unstar", "label", "schedule", "notify"})


def named_tool_tags(name: str) -> set[str]:
    """Tags of a tool that is not a shell, from its name (an MCP ``a__b__tool`` by its
    last part): a read-like first word wins, then any delete-like word, then any
    word that changes something elsewhere."""
    lower = name.lower()
    if "__" in lower:
        parts = [part for part in lower.split("__") if part]
        lower = parts[-1] if parts else ""
    if lower == "request_plugin_install":
        return {"external_side_effect", "install_local", "write_workspace", "network"}
    if lower == "automation_update" or lower.startswith("reorder_"):
        return {"external_side_effect"}
    if lower in _NAMED_READS or re.match(rf"(?:{'|'.join(_READ_VERBS)})(?:_|\Z)", lower):
        return {"read"}
    if lower in ("apply_patch", "edit", "write"):
        return {"write_workspace"}
    words = set(re.split(r"[_\-.]", lower))
    if words & _DELETE_VERBS:
        return {"delete", "external_side_effect"}
    if words & _WRITE_VERBS:
        return {"write_workspace"}
    if words & _EXTERNAL_VERBS:
        return {"external_side_effect"}
    return {"unknown"}


def host_action(tool_name: str, command: str = "") -> Action:
    """An action as the reference guard's host hook reports it (a ``Bash`` command or a named tool)."""
    is_shell = tool_name.lower() == "bash"
    tags = command_tags(command) if is_shell and command else named_tool_tags(tool_name)
    return Action(tool_name, command if is_shell else "", tuple(sorted(tags or {"unknown"})))


# -- corral's tools --------------------------------------------------------------------------

#: corral's own tools, tagged by what they do (not by their names, which the named-tool
#: heuristic would misread: ``fs.write`` is not an external side effect).
CORRAL_TAGS: dict[str, frozenset[str]] = {
    "fs.read": READ,
    "fs.list": READ,
    "fs.write": WRITE,
    "fs.patch": WRITE,
    "project.changeset": WRITE,
    "project.git_commit": WRITE,
    "project.git_inspect": READ,
    "project.git_status": READ,
    "project.git_diff": READ,
    "project.git_snapshot": READ,
    "command.output_read": READ,
    "preview.validate": READ,
    "image.inspect": READ,
    "process.poll": READ,
    "process.stdin": UNKNOWN,
    "process.terminate": UNKNOWN,
    "effect.record": frozenset({"external_side_effect"}),
    "effect.barrier": UNKNOWN,
    "user.input_request": READ,
    "goal.verdict": READ,
    "agent.run_status": READ,
    "agent.action_history": READ,
    "agent.delegate": frozenset({"delegate"}),
    "agent.spawn_isolated": frozenset({"delegate"}),
}
COMMAND_TOOLS = frozenset({"command.exec", "process.start"})


def command_line(tool_input: dict[str, Any]) -> str:
    """``{program, args}`` as one shell-quoted line, the form the command rules read."""
    program = tool_input.get("program")
    args = tool_input.get("args") or []
    if not isinstance(program, str) or not isinstance(args, list):
        return ""
    return shlex.join([program, *(str(arg) for arg in args)])


def corral_action(tool: str, tool_input: dict[str, Any]) -> Action:
    if tool in COMMAND_TOOLS:
        command = command_line(tool_input)
        return Action(tool, command, tuple(sorted(command_tags(command) or {"unknown"})))
    tags = CORRAL_TAGS.get(tool)
    if tags is None:
        # MCP (mcp.<server>.<tool>) and user tools: by the last part of the name.
        tags = frozenset(named_tool_tags(tool.split(".")[-1]))
    return Action(tool, "", tuple(sorted(tags)))
