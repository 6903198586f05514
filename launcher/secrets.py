"""Where the W&B key comes from, checked without ever printing it.

The key reaches the job through the environment only: sbatch passes the submitting
environment (Slurm keeps it readable by root and the Slurm user), or the job reads
``wandb.api_key_file`` on the node. It is never written into the script, the run
directory, a command line or a Hydra override.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from .errors import RecipeError
from .recipe import Recipe

KEY_ENV = "WANDB_API_KEY"
# wandb's own rule: a JWT, or after an optional "prefix-", 40+ characters of [A-Za-z0-9_-].
_KEY = re.compile(r"^(?:[A-Za-z0-9]+-)?[A-Za-z0-9_-]{40,}$")
_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")


@dataclass
class KeySource:
    where: str  # "environment" or "file /path"
    value: Optional[str]  # known only when it came from the environment


def needs_key(r: Recipe) -> bool:
    return r.wandb.enabled or r.trace.backend == "weave"


def looks_like_key(value: str) -> bool:
    return bool(_KEY.fullmatch(value) or _JWT.fullmatch(value))


def find_key(r: Recipe, environ: Mapping[str, str]) -> Optional[KeySource]:
    """The key's source for this recipe, or None. Raises RecipeError for a malformed key."""
    value = environ.get(KEY_ENV, "")
    if value:
        if not looks_like_key(value.strip()):
            raise RecipeError(f"${KEY_ENV} in your environment does not look like a W&B API key "
                              "(a JWT, or 40+ characters of letters, digits, '_' or '-')",
                              where="environment", key=KEY_ENV)
        return KeySource("environment", value.strip())
    if r.wandb.api_key_file:
        path = r.wandb.api_key_file
        if not os.path.isfile(path):
            raise RecipeError(f"{path} does not exist on this host (it must be on storage the nodes share)",
                              where=r.source, key="wandb.api_key_file")
        return KeySource(f"file {path}", None)
    return None


def require_key(r: Recipe, environ: Mapping[str, str]) -> Optional[KeySource]:
    src = find_key(r, environ)
    if src is None and needs_key(r):
        raise RecipeError(f"no W&B API key: export {KEY_ENV} or set wandb.api_key_file "
                          "(W&B logging or Weave tracing is on)", where=r.source, key="wandb")
    return src


def redact(text: str, environ: Mapping[str, str] = os.environ) -> str:
    """Remove the key's value from anything about to be printed."""
    value = environ.get(KEY_ENV, "").strip()
    if len(value) >= 8:
        text = text.replace(value, "<redacted>")
    return text
