"""The one error type users see for bad input: it names the file and the field. Checks that
find several problems say them all at once (`Problems`), so that a user with hours in a queue
fixes them in one go rather than one resubmission each."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List

EXIT_BAD_INPUT = 2  # bad recipe / override / flag: nothing written, nothing queued
EXIT_FAILED = 1  # a Slurm command or the job itself failed
EXIT_NEVER_STARTS = 3  # --wait: the job stays queued for a reason that cannot clear by itself (left queued)


class RecipeError(Exception):
    """Bad input. ``where`` is the file (or 'command line'), ``key`` the dotted field."""

    def __init__(self, message: str, *, where: str, key: str | None = None):
        self.message = message
        self.where = where
        self.key = key
        # Said after the refusal, so that one try shows every problem: what would be warned
        # about (a missing image), and what could not be checked because of the refusal.
        self.warnings: List[str] = []
        self.unchecked: str | None = None
        super().__init__(str(self))

    def with_warnings(self, warnings, unchecked: str | None = None) -> "RecipeError":
        """Itself, with WARNINGS (each once, in order, none an error already says: --resume
        refuses what check only warns of) and what was UNCHECKED added."""
        said = [e.message for e in self.each]
        for w in warnings:
            w = w[len("warning: "):] if w.startswith("warning: ") else w  # said once, as the CLI labels it
            if w not in self.warnings and not any(w in m for m in said):
                self.warnings.append(w)
        self.unchecked = unchecked or self.unchecked
        return self

    def __str__(self) -> str:
        field = f"{self.key}: " if self.key else ""
        return f"{self.where}: {field}{self.message}"

    @property
    def each(self) -> List["RecipeError"]:
        """The problems this error says: itself, or a RecipeErrors' every one."""
        return [self]


class RecipeErrors(RecipeError):
    """Several problems at once; the first names the error's own where and key."""

    def __init__(self, errors: List[RecipeError]):
        self.errors = errors
        super().__init__(errors[0].message, where=errors[0].where, key=errors[0].key)

    def __str__(self) -> str:
        return f"{len(self.errors)} problems, each to fix before it can run:\n" + \
            "\n".join(f"  {e}" for e in self.errors)

    @property
    def each(self) -> List[RecipeError]:
        return list(self.errors)


class Problems:
    """What a check finds, gathered: `bad` and `gather` collect, `done` raises them all as one
    error (the one problem itself when there is one)."""

    def __init__(self, blame=lambda key: "recipe"):
        self.found: List[RecipeError] = []
        self.blame = blame

    def bad(self, key: str, message: str) -> None:
        self.found.append(RecipeError(message, where=self.blame(key), key=key))

    @contextmanager
    def gather(self) -> Iterator[None]:
        """A check that raises: its problem(s) join the rest (a secret's never: said at once)."""
        try:
            yield
        except RecipeError as e:
            if getattr(e, "at_once", False):
                raise
            self.found.extend(e.each)

    def error(self):
        """Every problem as one RecipeError (None: none)."""
        return one_error(self.found)

    def done(self) -> None:
        e = self.error()
        if e is not None:
            raise e


class SlurmError(Exception):
    """A Slurm command failed, or the run asked for is unknown (exit code 1)."""


class RemoteError(SlurmError):
    """A service the run uses (W&B, Weave) could not be reached or answered wrongly (exit code 1)."""


def one_error(errors: List[RecipeError]):
    """ERRORS (each said once, in order) as one RecipeError; None for none."""
    seen, unique = set(), []
    for e in (x for err in errors for x in err.each):
        if str(e) not in seen:
            seen.add(str(e))
            unique.append(e)
    return None if not unique else unique[0] if len(unique) == 1 else RecipeErrors(unique)
