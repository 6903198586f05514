"""What the commands (cli/) print for an error: one line on stderr, never a
secret's value in it, and the exit code to return."""

from __future__ import annotations

import sys


def redact(text: str) -> str:
    """TEXT without any secret's value (secrets.redact), for whatever the commands print."""
    from ..checks.secrets import redact as without_secrets

    return without_secrets(text)


def fail(message: str, code: int) -> int:
    from ..checks.secrets import redact  # here: the CLI starts without the recipe model

    print(redact(message), file=sys.stderr)
    return code
