"""verl-launch: render, check and submit VERL runs to Slurm.

The flow, one module each: recipe (load + validate) -> overrides (verl's command line)
-> render (pure: recipe in, script text out) -> slurm (the only module that runs Slurm
commands) -> cli (thin).
"""

__version__ = "0.1.0"
