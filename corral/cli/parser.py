"""The argparse parser of every ``corral`` command: a usage error names the
closest command or option (``unknown command 'stat'; did you mean 'status'?``)
instead of a bare refusal.

Python 3.14's ``suggest_on_error`` does part of this; corral supports 3.11, and
argparse reports a missing required option before an unknown one, so
``corral run --agnet x`` said only "--agent is required". Here each command's
own arguments are checked for unknown options first (``CheckedSubParsers``),
and a bad choice is reported with its closest match (``Parser._check_value``).
argparse has no public way to list a parser's options: ``_option_string_actions``
and ``_check_value`` are the stable internals shtab and others rely on too.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import Any

from corral.supervisor.spec.spec_base import did_you_mean

#: What argparse takes for a negative number, a value and never an option.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def unknown_option(parser: argparse.ArgumentParser, args: Sequence[str]) -> str | None:
    """The first option in ``args`` that ``parser`` does not know (abbreviations of
    its long options are known, as argparse takes them). A parser with subcommands
    owns only what comes before its subcommand; the subcommand checks the rest."""
    options = parser._option_string_actions
    has_subcommands = any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)
    value_next = False
    for token in args:
        if value_next:  # the value of the option before it, whatever it looks like
            value_next = False
            continue
        if token == "--":
            return None
        if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token) or " " in token:
            if has_subcommands:
                return None  # the subcommand: what follows is its own
            continue
        name, equals, _value = token.partition("=")
        action = options.get(name)
        if action is None and name.startswith("--") and parser.allow_abbrev:
            matches = [option for option in options if option.startswith(name)]
            action = options[matches[0]] if len(matches) == 1 else None
            if len(matches) > 1:
                continue  # ambiguous: argparse says so, naming them
        if action is None and not name.startswith("--") and name[:2] in options:
            continue  # -xVALUE, or short flags together
        if action is None:
            return name
        value_next = not equals and action.nargs != 0
    return None


def refuse_unknown_option(parser: argparse.ArgumentParser, args: Sequence[str]) -> None:
    """A usage error (exit 2) naming the first unknown option and its closest match."""
    name = unknown_option(parser, args)
    if name is not None:
        # Compared without the dashes, which every option shares (--since is not --intent).
        known = {option.lstrip("-"): option for option in parser._option_string_actions if option.startswith("--")}
        close = difflib.get_close_matches(name.lstrip("-"), list(known), n=1)
        hint = f"; did you mean {known[close[0]]!r}?" if close else f" (`{parser.prog} --help` lists them)"
        parser.error(f"unknown option {name!r}{hint}")


class CheckedSubParsers(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose own arguments are checked for unknown options before
    argparse parses them (and reports a missing required option instead)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if isinstance(values, list) and values and values[0] in self.choices:
            refuse_unknown_option(self.choices[values[0]], values[1:])
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """``corral``'s parser, and every subcommand's (argparse builds them of this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", CheckedSubParsers)

    def parse_command_line(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """``parse_args``, with the options before the command checked too."""
        import sys

        args = list(sys.argv[1:] if argv is None else argv)
        refuse_unknown_option(self, args)
        return self.parse_args(args)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(choice) for choice in choices]
        hint = did_you_mean(str(value), names)
        if isinstance(action, argparse._SubParsersAction):
            hint = hint or f" (`{self.prog} --help` lists them)"
            raise argparse.ArgumentError(None, f"unknown command {value!r}{hint}")
        raise argparse.ArgumentError(action, f"invalid choice {value!r}{hint} (choose from {', '.join(names)})")
