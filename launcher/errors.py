"""The one error type users see for bad input: it names the file and the field."""

from __future__ import annotations

EXIT_BAD_INPUT = 2  # bad recipe / override / flag: nothing written, nothing queued
EXIT_FAILED = 1  # a Slurm command or the job itself failed
EXIT_NEVER_STARTS = 3  # --wait: the job stays queued for a reason that cannot clear by itself (left queued)


class RecipeError(Exception):
    """Bad input. ``where`` is the file (or 'command line'), ``key`` the dotted field."""

    def __init__(self, message: str, *, where: str, key: str | None = None):
        self.message = message
        self.where = where
        self.key = key
        super().__init__(str(self))

    def __str__(self) -> str:
        field = f"{self.key}: " if self.key else ""
        return f"{self.where}: {field}{self.message}"


class SlurmError(Exception):
    """A Slurm command failed, or the run asked for is unknown (exit code 1)."""


class RemoteError(SlurmError):
    """A service the run uses (W&B, Weave) could not be reached or answered wrongly (exit code 1)."""
