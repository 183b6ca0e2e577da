"""One exit-code scheme and one-line errors for every diffdx command line.

    0  the engines agree / the issue was not reproduced / the command finished
    1  the engines diverge / the issue was diagnosed / a case failed validation
    2  bad input: a path, pattern, option, scenario or issue that cannot be used as given
    3  environment failure: an engine process crashed or timed out, a host could not be reached,
       an output folder could not be written
    4  (agent.run) not reproduced as reported, but the trigger search found another divergence
       that the issue does not describe (a side finding, reported as such)
    5  internal error: a bug in diffdx itself (its traceback is printed); never read as "diverged"

Each CLI's `main` runs inside `run_cli`, which turns a `DiffdxError` (and a few stdlib errors
that only ever mean bad input or a broken environment) into `error: <one line>` on stderr and
the exit code above. Anything else is a bug in diffdx: its traceback is printed and the exit code is 5, so a
script never reads a crash of the tool as a divergence of the engine (Python's own exit for an uncaught
exception is 1, the code for "diverged").
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path

AGREE = 0  # also: not reproduced, finished
DIVERGED = 1  # also: diagnosed, validation failed
BAD_INPUT = 2
ENVIRONMENT = 3
SIDE_FINDING = 4  # agent.run: the reported trigger agrees, another variant diverged
INTERNAL = 5  # a bug in diffdx: traceback printed, never confused with DIVERGED

EPILOG = (
    "exit status: 0 agree / not reproduced / done, 1 diverged / diagnosed, "
    "2 bad input (path, option, scenario, issue), 3 environment failure "
    "(engine crash or timeout, network, unwritable output); agent.run: 4 not reproduced as "
    "reported, another divergence found while searching (a side finding); 5 internal error (a diffdx bug)"
)


class DiffdxError(Exception):
    """An error the user can act on; `exit_code` is its place in the scheme above."""

    exit_code = ENVIRONMENT


class BadInput(DiffdxError, ValueError):
    """Something the user gave (flag, file, scenario key, issue text) cannot be used."""

    exit_code = BAD_INPUT


class EnvironmentFailure(DiffdxError, RuntimeError):
    """The input was fine but the machine was not: crash, timeout, network, disk."""

    exit_code = ENVIRONMENT


class HostUnreachable(EnvironmentFailure):
    """A network host (GitHub, an LLM endpoint) could not be reached at all."""


def one_line(message: object, limit: int = 400) -> str:
    """Any message -> a single line (the first non-empty one, cut to `limit`)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    text = lines[0] if lines else type(message).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def exit_code_of(error: BaseException) -> int | None:
    """The scheme's code for an error a CLI may end with, or None for a bug (keep the traceback)."""
    if isinstance(error, DiffdxError):
        return error.exit_code
    if type(error).__name__ == "EngineRunError":  # tools.engines.runner: worker crash / timeout
        return ENVIRONMENT
    if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return BAD_INPUT
    if isinstance(error, OSError):  # disk full, permission denied, …
        return ENVIRONMENT
    return None


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a CLI `main`; a known error becomes `error: <one line>` and its exit code.
    argparse's own exit (2 for a usage error, 0 for --help) is returned, not raised."""
    try:
        return main(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(f"error: {one_line(e.code)}", file=sys.stderr)
            return BAD_INPUT
        return e.code or 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        code = exit_code_of(e)
        if code is None:
            traceback.print_exc()
            print(
                f"internal error (a bug in diffdx, please report it with the traceback above): {one_line(e)}",
                file=sys.stderr,
            )
            return INTERNAL
        print(f"error: {one_line(e)}", file=sys.stderr)
        return code


def writable_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create `path` (and parents) or raise: a file there is bad input, a denied folder an environment failure."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BadInput(f"{flag} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".diffdx-write-test"
        probe.write_text("")
        probe.unlink()
    except (FileExistsError, NotADirectoryError):
        raise BadInput(f"{flag} {path}: a parent of it is a file, not a folder") from None
    except OSError as e:
        raise EnvironmentFailure(f"{flag} {path} is not writable ({e.strerror or e})") from None
    return path
