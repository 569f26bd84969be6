"""Exit codes, and the one place that turns a command's failure into one.

0 success, 1 failure, 2 bad usage (argparse's own code, and :class:`CliError` with code 2), 130
interrupted (Ctrl-C, as shells report SIGINT). A failure the user can act on is one line on
stderr, never a traceback: :class:`CliError` for what the command itself found wrong, and the
client's errors (``sluice.errors.SluiceError``: Kafka's error code name and the message),
``ValueError``/``OSError`` and gRPC errors for what the cluster or the machine answered.
Anything else is a bug and keeps its traceback; ``SLUICE_DEBUG=1`` shows the traceback of every
failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from sluice.cli.output import err

SUCCESS = 0
FAILURE = 1
USAGE = 2
INTERRUPTED = 130


class CliError(Exception):
    """An error to report in one line (no traceback), with its exit code."""

    def __init__(self, message: str, code: int = FAILURE) -> None:
        super().__init__(message)
        self.code = code


def describe_error(exc: BaseException) -> str:
    """``CODE_NAME: message`` for the client's errors, ``ExceptionType: message`` for the rest."""
    code_name = getattr(exc, "code_name", None)
    if code_name and code_name != "CLIENT_ERROR":
        return f"{code_name}: {exc}"
    return f"{type(exc).__name__}: {exc}"


def run(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``command(args)``'s exit code, with every expected failure reported in one line."""
    try:
        return command(args)
    except CliError as exc:
        err(f"error: {exc}")
        return exc.code
    except KeyboardInterrupt:
        err("interrupted")
        return INTERRUPTED
    except BrokenPipeError:
        # `sluice consume ... | head`: the reader left; that is not an error of ours.
        _silence_stdout()
        return SUCCESS
    except Exception as exc:
        if os.environ.get("SLUICE_DEBUG"):
            raise
        from sluice import errors

        if isinstance(exc, errors.SluiceError | ValueError | OSError):
            err(f"error: {describe_error(exc)}")
            return FAILURE
        if type(exc).__module__.startswith("grpc"):
            err(f"error: the cluster did not answer: {exc}")
            return FAILURE
        raise


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
