"""A Typer app holding only the planner's commands, for tests of tunebench.commands.plan."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from tunebench.commands.plan import register


def invoke_plan(*args: str, env: dict | None = None):
    """Run a planner command (plan, recommend, deploy-spec, calibrate) in-process; the click Result."""
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """test app"""

    register(app)
    return CliRunner().invoke(app, list(args), env=env)
