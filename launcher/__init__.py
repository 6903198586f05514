"""verl-launch: render, check and submit VERL runs to Slurm.

The flow, one module each: recipe (load + validate) -> overrides (verl's command line)
-> plan (everything the job needs, worked out once) -> render (pure: plan in, script text
out) -> request (the dry-run) -> backends (Slurm or local; slurm.py is the only module that
runs Slurm commands) -> state (the run state) -> api (the one door) -> cli (prints it).
"""

__version__ = "0.1.0"

API = ("script", "check", "dryrun", "submit", "sweep", "runs", "run", "Run", "SweepRun", "Report", "image_import", "merge",
       "merge_dryrun", "wait_merge")


def __getattr__(name):  # the Python API, loaded on first use (the CLI does not pay for it)
    if name in API:
        from . import api

        return getattr(api, name)
    if name in ("RecipeError", "SlurmError"):
        from . import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
