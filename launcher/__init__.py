"""verl-launch: render, check and submit VERL runs to Slurm.

The flow, one folder each (docs/internals.md): core/ (recipe -> plan -> render, pure ->
request; prepare, the one pipeline) with checks/ (what is checked before anything is queued)
-> backends/ (Slurm or here; the only room that runs Slurm's commands) -> jobs/ (what has
been submitted: state, logs, traces, merge) -> api (the one door) -> cli/ (prints it).
"""

__version__ = "0.1.0"

API = ("script", "check", "dryrun", "submit", "sweep", "runs", "run", "Run", "SweepRun", "Report", "image_import", "merge",
       "merge_dryrun", "wait_merge", "import_command")


def __getattr__(name):  # the Python API, loaded on first use (the CLI does not pay for it)
    if name in API:
        from . import api

        return getattr(api, name)
    if name in ("RecipeError", "SlurmError"):
        from . import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
