"""``corral completion bash|zsh|fish``: a shell completion script, generated from
the same argparse tree the commands are parsed with, so it never lists a command
or an option that does not exist. bash and zsh come from shtab; shtab has no fish,
so fish's is written here: one ``complete`` line per command and option."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from corral.cli.main import arguments, build_parser, command

SHELLS = ("bash", "zsh", "fish")

INSTALL = """install:
  bash  in ~/.bashrc: eval "$(corral completion bash)"
  zsh   corral completion zsh > ~/.zfunc/_corral, with fpath+=(~/.zfunc) before compinit in ~/.zshrc
  fish  corral completion fish > ~/.config/fish/completions/corral.fish"""


def _completion_args(parser: argparse.ArgumentParser) -> None:
    parser.epilog = INSTALL
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")


@command("completion", "print a shell completion script (bash, zsh or fish) for every command and option")
@arguments(_completion_args)
def cmd_completion(args: argparse.Namespace) -> int:
    print(script(args.shell, build_parser()))
    return 0


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    if shell == "fish":
        return "\n".join(fish_lines(parser))
    import shtab  # only here: nothing else needs it

    return str(shtab.complete(parser, shell=shell))


# -- fish --------------------------------------------------------------------------


def fish_lines(parser: argparse.ArgumentParser) -> Iterator[str]:
    prog = parser.prog
    yield f"# fish completion for {prog}, generated from its argparse tree: `{prog} completion fish`"
    yield f"complete -c {prog} -f"  # no file names unless an option takes a value
    yield from _fish_parser(prog, parser, ())


def _fish_parser(prog: str, parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[str]:
    """``path`` is the commands that lead to ``parser`` (``("mcp", "list")``)."""
    here = "; and ".join(f"__fish_seen_subcommand_from {name}" for name in path) or "__fish_use_subcommand"
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in action.choices.items():
                yield f"complete -c {prog} -n {_quote(here)} -a {name} -d {_quote(helps.get(name, ''))}"
                yield from _fish_parser(prog, child, (*path, name))
        elif action.option_strings:
            flags = " ".join(
                f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"
                for option in action.option_strings
            )
            value = ""
            if action.nargs != 0:
                value = f" -x -a {_quote(' '.join(map(str, action.choices)))}" if action.choices else " -r -F"
            yield f"complete -c {prog} -n {_quote(here)} {flags}{value} -d {_quote(_expanded(action))}"
        elif action.choices:  # a positional with its values listed (the shell of this very command)
            words = " ".join(map(str, action.choices))
            yield f"complete -c {prog} -n {_quote(here)} -a {_quote(words)} -d {_quote(_expanded(action))}"


def _expanded(action: argparse.Action) -> str:
    """The option's help as ``--help`` shows it (``%(default)s`` filled in)."""
    text = action.help or ""
    try:
        return text % {**vars(action), "default": action.default}
    except (KeyError, TypeError, ValueError):
        return text


def _quote(text: str) -> str:
    """One fish word: single quotes, with ``\\`` and ``'`` escaped."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
