"""Library refusals as click errors, in one place.

The library checks its input at its public boundary and raises ValueError or TypeError with
a message that names the parameter and what it got. Every ``mgpu`` command is a
:class:`Command`, which turns such an error into a usage error (exit status 2) with the
library's words, so commands do not check again what the library checks; a cluster that
cannot be reached (ConnectionError, TimeoutError, whose messages say where and what to
check) ends with exit status 1 and those words, not a traceback. Checks of what only the
command line knows (files, option combinations) stay in the commands.
"""
from __future__ import annotations

import logging
from typing import Any

import click

logger = logging.getLogger("mgpu.cli")


class Command(click.Command):
    """A command whose library refusals (ValueError, TypeError) are usage errors."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ValueError, TypeError) as exc:
            logger.debug("%s refused", ctx.command_path, exc_info=True)  # the trace with -vv
            raise click.UsageError(str(exc), ctx) from None
        except (ConnectionError, TimeoutError) as exc:  # a cluster that is not there
            logger.debug("%s could not reach its cluster", ctx.command_path, exc_info=True)
            raise click.ClickException(str(exc)) from None


class Group(click.Group):
    """A group whose commands are :class:`Command` and whose subgroups are groups like it."""

    command_class = Command
    group_class = type


def data_error(exc: Exception) -> click.ClickException:
    """A file that could not be read or used: exit status 1 with the reader's words."""
    return click.ClickException(str(exc))
