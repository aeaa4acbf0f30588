"""Every command's --help shows a boolean flag as the flag alone (--wide, --lomo/--no-lomo): no value type."""

from __future__ import annotations

import typer

from tunebench.commands.main import app, main


def _commands(command, path=()):
    """(path, click command) of every command and group under command."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_help_of_every_command_shows_flags_without_a_value_type(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per option: a flag and its help on the same line
    checked = 0
    for path, command in _commands(typer.main.get_command(app)):
        assert main([*path, "--help"]) == 0
        out = capsys.readouterr().out
        assert "<bool>" not in out, " ".join(path)
        for param in command.params:
            if getattr(param, "is_flag", False) and not param.hidden and param.help:
                checked += 1
                line = next(line for line in out.splitlines() if line.lstrip("│ *").startswith(param.opts[0] + " "))
                # the flag's line goes from its names straight to its help: no value type between them
                names = line[line.index(param.opts[0]) : line.index(param.help.split()[0])]
                assert "<" not in names and all(n in names for n in (*param.opts, *param.secondary_opts)), line
    assert checked > 30  # --json, --wide, --lomo/--no-lomo, ... across the commands


def test_a_negatable_flag_shows_both_names(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["calibrate", "--help"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "--no-lomo" in line)
    assert "--lomo" in line and "<" not in line


def test_help_of_every_command_fits_80_columns_without_cutting_anything(capsys, monkeypatch):
    """At 80 columns no option name, value type or help word is cut (no '…', no 'ran'/'dom' fold), and
    a paragraph of prose wraps to the terminal, not at its docstring's line ends."""
    monkeypatch.setenv("COLUMNS", "80")
    for path, command in _commands(typer.main.get_command(app)):
        assert main([*path, "--help"]) == 0
        out = capsys.readouterr().out
        assert "…" not in out, " ".join(path)
        lines = out.splitlines()
        assert all(len(line) <= 80 for line in lines), " ".join(path)
        for param in command.params:
            for name in (*param.opts, *param.secondary_opts):
                if name.startswith("--") and not param.hidden:
                    assert any(name in line.split() for line in lines), (path, name)
            if param.metavar and param.metavar.startswith("["):  # choices: printed whole on one line
                assert any(param.metavar in line for line in lines), (path, param.metavar)
    main(["calibrate", "--help"])
    prose = capsys.readouterr().out.split("╭")[0]
    assert "fitted on, so a few local runs" in " ".join(line.strip() for line in prose.splitlines())
    assert all(len(line.rstrip()) > 60 for line in prose.splitlines()[6:9]), prose
