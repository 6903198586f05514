"""The launcher's own checks for known traps in the verl settings a recipe produces.

Each one catches a mistake that would otherwise cost a queue wait and a failed or useless
run; verl's own validation (issue 4's preflight) runs separately, in verl itself.
"""

from __future__ import annotations

import posixpath
from typing import Any, Dict

from .errors import RecipeError
from .overrides import flatten
from .recipe import Recipe

CKPT_DIR = "trainer.default_local_dir"


def verl_settings(r: Recipe, blame=lambda key: "recipe") -> Dict[str, Any]:
    """The recipe's verl overrides by plain dotted key (no + prefixes)."""
    return {k.lstrip("+"): v for k, v in flatten(r.verl.overrides, blame).items()}


def check(r: Recipe, blame=lambda key: "recipe") -> None:
    """Raise RecipeError, naming the field, for the first trap found."""
    v = verl_settings(r, blame)

    def bad(key: str, message: str) -> None:
        raise RecipeError(message, where=blame(key), key=key)

    ckpt = v.get(CKPT_DIR)
    if ckpt is not None and not posixpath.isabs(str(ckpt)):
        bad(f"verl.overrides.{CKPT_DIR}", f"{ckpt!r} is relative: verl would write checkpoints under "
            "the run directory of each job; give an absolute directory on shared storage")
    if r.cluster.requeue:
        if ckpt is None:
            bad(f"verl.overrides.{CKPT_DIR}", "cluster.requeue resumes from checkpoints: set it to an "
                "absolute directory on shared storage, so the restarted job finds them")
        freq = v.get("trainer.save_freq")
        if not isinstance(freq, int) or isinstance(freq, bool) or freq <= 0:
            bad("verl.overrides.trainer.save_freq", "cluster.requeue resumes from checkpoints: set it to "
                "a positive number of steps (verl's default -1 saves none)")
