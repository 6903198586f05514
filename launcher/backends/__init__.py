"""Where a Request runs: Slurm (backends/slurm.py) or this machine (backends/local.py), behind one
interface (`Backend`), chosen once: `choose(local)` for a new recipe, `of(run)` for a recorded
run. Everything that differs between the two lives in them, and nothing above this package
asks which one it has (TorchX's Scheduler: `submit` is `schedule` of a `dryrun`).

A job info has one shape for both and for every caller (Run.wait, SweepRun.wait, logs -f):
{"state", "exit_code", "reason", ...} (slurm._info; local: state, exit_code, reason, source).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Protocol, TextIO


class Backend(Protocol):
    name: str  # recorded with each run ("local" runs keep their record's `local: true`)
    title: str  # as said to users: "Slurm", "local"

    def load(self, recipe, overrides: List[str], environ: Mapping[str, str], notes: Optional[TextIO] = None):
        """The recipe as it would run here (recipe.Loaded); what this changes of it said on NOTES."""

    def weigh(self, plan, had) -> List[tuple]:
        """check's lines on what the run costs and when it would start (summary.weigh)."""

    def dryrun(self, prepared):
        """One run's Request (core/request.py) from a core.prepare.Prepared that has no refusal."""

    def dryrun_sweep(self, sweep, max_parallel: Optional[int] = None):
        """A sweep's Request (sweeps.Sweep, its points prepared)."""

    def schedule(self, request, environ: Optional[Mapping[str, str]] = None, out: Optional[TextIO] = None) -> dict:
        """Carry the Request out; the run's record (a run here: once it has ended)."""

    def states(self, runs: List[dict]) -> Dict[str, dict]:
        """{run_dir: job info} of recorded runs."""

    def ended(self, run: dict) -> tuple:
        """(ended, its state in words), for `logs -f`."""

    def cancel(self, run: dict) -> None: ...

    def allocations(self, run: dict) -> Optional[List[dict]]:
        """Each attempt's allocation in order ({start, end, nodes, submit}, epoch seconds); None
        where no scheduler allocates (a local run)."""

    def wait(self, run: dict, on_change=None, poll: float = 2.0, timeout: Optional[float] = None, **kw) -> dict:
        """Until the run ends (or TIMEOUT): its last job info."""

    def wait_many(self, runs: List[dict], on_change=None, poll: float = 2.0, timeout: Optional[float] = None,
                  **kw) -> Dict[str, dict]:
        """Until every run of RUNS ends (a sweep's points): {run_dir: job info}."""

    # The merge job (jobs/merge_job.py), a submitit job through the same backend.
    def serve_gpus(self, r) -> int:
        """GPUs the serve check asks for (recipe R's nodes; none here)."""

    def merge_executor(self, folder, r, params: dict):
        """submitit's executor for a one-node merge job (PARAMS: jobs.merge_job.job_params)."""

    def wait_merge(self, job, on_change=None, poll: float = 2.0) -> None:
        """Until the merge job ends (SlurmError: it left no result)."""

    def merge_state(self, merge: dict) -> str:
        """The state of a recorded merge whose merged model has no marker."""


def choose(local: bool) -> Backend:
    if local:
        from .local import LocalBackend

        return LocalBackend()
    from .slurm import SlurmBackend

    return SlurmBackend()


def of(run: dict) -> Backend:
    """The backend a recorded run (or a Request's record) went to."""
    return choose(bool(run.get("local")))
