"""The command-line reference: every command of `gpufeed` with its help, usage, arguments and
options (defaults included), read from the typer app in gpufeed/cli/, in the order
`gpufeed --help` lists them. (Typer keeps its own copy of click: parameters are told apart by
`param_type_name`, not by class.)"""

from __future__ import annotations

import inspect
from typing import Any

from markdown_text import cell, prose, table


def cli_markdown() -> str:
    """One `##` section per command."""
    import typer

    from gpufeed.cli import app

    group: Any = typer.main.get_command(app)
    commands = group.commands.items()
    return "\n\n".join(command_markdown(n, c) for n, c in commands if not c.hidden) + "\n"


def command_markdown(name: str, command: Any) -> str:
    """A command's section: usage, its whole docstring, then a table of its parameters."""
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option"]
    usage = " ".join(["gpufeed", name, "[OPTIONS]", *(argument_usage(a) for a in arguments)])
    parts = [f"## gpufeed {name}", f"```text\n{usage}\n```"]
    parts.append(prose(inspect.cleandoc(command.help or "")))
    rows = [(f"`{argument_usage(a)}`", cell(help_of(a)), shown_default(a)) for a in arguments]
    rows += [(option_names(o), cell(help_of(o)), shown_default(o)) for o in options]
    if rows:
        parts.append(table(("argument or option", "meaning", "default"), rows))
    return "\n\n".join(parts)


def argument_usage(argument: Any) -> str:
    """`NAME`, `NAME...` for several, in brackets where it may be left out."""
    text = (argument.name or "").upper() + ("..." if argument.nargs == -1 else "")
    return text if argument.required else f"[{text}]"


def option_names(option: Any) -> str:
    """`--out`, `-o`, and a switch's other half (`--full` / `--reduced`)."""
    names = ", ".join(f"`{n}`" for n in option.opts)
    if option.secondary_opts:
        names += " / " + ", ".join(f"`{n}`" for n in option.secondary_opts)
    return names


def help_of(parameter: Any) -> str:
    """The help string typer keeps on the parameter."""
    return str(getattr(parameter, "help", None) or "")


def shown_default(parameter: Any) -> str:
    """The default as `--help` shows it; nothing where it is None or off."""
    value = parameter.default
    if value is None or value is False or value == () or callable(value):
        return ""
    return f"`{value}`"
