"""Secrets: where the W&B key (and the recipe's declared secrets) come from, checked without
ever printing a value.

Values reach the job through the environment only: sbatch passes the submitting environment
(Slurm keeps it readable by root and the Slurm user), or the job reads the key on the node
from ``wandb.api_key_file`` or ``~/.netrc``. A value is never written into the script, the
run directory, a command line or a Hydra override, and is redacted from what the CLI prints.

Key sources, first found wins, at submit and again inside the job:
1. ``$WANDB_API_KEY`` in the submitting environment;
2. ``wandb.api_key_file``: a file that must be yours and not readable by group or others;
3. ``~/.netrc``: the entry for the W&B host (that of ``wandb.base_url``).
"""

from __future__ import annotations

import dataclasses
import netrc
import os
import re
import stat
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional
from urllib.parse import urlparse

from ..errors import Problems, RecipeError
from ..base.schema import Recipe

KEY_ENV = "WANDB_API_KEY"
DEFAULT_HOST = "api.wandb.ai"
# wandb's own rule: a JWT, or after an optional "prefix-", 40+ characters of [A-Za-z0-9_-].
_KEY = re.compile(r"(?:[A-Za-z0-9]+-)?[A-Za-z0-9_-]{40,}")
_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_FORMAT = "a JWT, or 40+ characters of letters, digits, '_' or '-' after an optional 'prefix-'"


@dataclass
class KeySource:
    where: str  # "environment", "file /path" or "~/.netrc (host)"
    value: Optional[str]


def needs_key(r: Recipe) -> bool:
    return r.wandb.enabled or r.trace.backend == "weave"


def wandb_host(r: Recipe) -> str:
    return host_of(r.wandb.base_url)


def looks_like_key(value: str) -> bool:
    return bool(_KEY.fullmatch(value) or _JWT.fullmatch(value))


WHERE_KEYS = f"${KEY_ENV}, wandb.api_key_file, or ~/.netrc"  # where keys are looked for, in order


def host_of(base_url: Optional[str]) -> str:
    """The W&B host of a base URL (what ~/.netrc names)."""
    return (urlparse(base_url).hostname if base_url else None) or DEFAULT_HOST


def find_key(r: Recipe, environ: Mapping[str, str]) -> Optional[KeySource]:
    """The first key source for this recipe, or None. Raises RecipeError (exit 2) for a
    refused source, with a message that never holds the value."""
    return find_key_at(r.wandb.base_url, r.wandb.api_key_file, r.source, environ)


def find_key_at(base_url: Optional[str], api_key_file: Optional[str], source: str,
                environ: Mapping[str, str]) -> Optional[KeySource]:
    """find_key for W&B at BASE_URL, with that key file (named in the file SOURCE)."""
    value = environ.get(KEY_ENV, "").strip()
    if value:
        _check_format(value, where="environment", key=KEY_ENV)
        return KeySource("environment", value)
    if api_key_file:
        path = api_key_file
        value = read_private_file(path, where=source, key="wandb.api_key_file")
        _check_format(value, where=path, key="wandb.api_key_file")
        return KeySource(f"file {path}", value)
    home = environ.get("HOME") or os.path.expanduser("~")
    path = os.path.join(home, ".netrc")
    if os.path.isfile(path):
        host = host_of(base_url)
        read_private_file(path, where=path, key="permissions")  # as strict as the job's check
        try:
            auth = netrc.netrc(path).authenticators(host)
        except netrc.NetrcParseError as e:  # its message may quote another host's password
            raise RecipeError(f"cannot parse it (line {e.lineno})", where=path) from None
        except (OSError, UnicodeError):
            raise RecipeError("cannot read it", where=path) from None
        if auth and auth[2]:
            _check_format(auth[2], where=path, key=f"machine {host}")
            return KeySource(f"~/.netrc ({host})", auth[2])
    return None


def read_private_file(path: str, where: str, key: str) -> str:
    """A secret file's content, refused unless it is the user's own and 0600 (or 0400)."""
    try:
        st = os.stat(path)
    except OSError:
        raise RecipeError(f"{path} does not exist on this host (it must be on storage the nodes share)",
                          where=where, key=key) from None
    if not stat.S_ISREG(st.st_mode):
        raise RecipeError(f"{path} is not a regular file", where=where, key=key)
    if st.st_uid != os.getuid():
        raise RecipeError(f"{path} is not owned by you: a secret file must be yours", where=where, key=key)
    if st.st_mode & 0o077:
        raise RecipeError(f"{path} is readable or writable by group or others (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}): chmod 600 it", where=where, key=key)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except (OSError, UnicodeError):
        raise RecipeError(f"{path} cannot be read as text", where=where, key=key) from None


def _check_format(value: str, where: str, key: str) -> None:
    if not looks_like_key(value):
        raise RecipeError(f"does not look like a W&B API key ({_FORMAT})", where=where, key=key)


def require(r: Recipe, environ: Mapping[str, str]) -> Optional[KeySource]:
    """Everything ``submit`` needs before it queues: the key (when W&B or Weave is on) and
    each declared secret in the environment, and none of their values inside the recipe."""
    refuse_in_recipe(r, secret_values(r, environ))  # first: nothing of the recipe is shown after it
    problems = Problems()
    src = None
    with problems.gather():
        src = find_key(r, environ)
        if src and src.value:  # a key from ~/.netrc or wandb.api_key_file
            refuse_in_recipe(r, [src.value])
        if src is None and needs_key(r):
            raise RecipeError(f"no W&B API key: export {KEY_ENV}, set wandb.api_key_file, or add "
                              f"{wandb_host(r)} to ~/.netrc (W&B logging or Weave tracing is on)",
                              where=r.source, key="wandb")
    for name in r.secrets:  # each one unset, with the key's problem: all said at once
        if not environ.get(name):
            problems.found.append(RecipeError(f"declared secret ${name} is not set in your environment",
                                              where=r.source, key="secrets"))
    problems.done()
    return src


def secret_values(r: Recipe, environ: Mapping[str, str]) -> List[str]:
    return [environ.get(KEY_ENV, "")] + [environ.get(n, "") for n in r.secrets]


class SecretInRecipe(RecipeError):
    """A secret's value inside the recipe: nothing of the recipe may be printed after it."""

    at_once = True  # Problems.gather lets it through: nothing is checked or said after it


def refuse_in_recipe(r: Recipe, values: Iterable[str]) -> None:
    """A secret's value written into the recipe would reach the script: refuse, naming the
    field only."""
    values = [v for v in values if len(v) >= 8]
    if not values:
        return
    for key, text in _strings(dataclasses.asdict(r)):
        if any(v in text for v in values):
            raise SecretInRecipe("holds the value of a secret: pass secrets by name only "
                              "(export them; see `secrets` and wandb.api_key_file)", where=r.source, key=key)


def _strings(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{prefix}[{i}]")
    elif isinstance(node, str):
        yield prefix, node


# Names that say a variable holds a secret (the job script redacts by the same rule).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)


def redact(text: str, environ: Mapping[str, str] = os.environ) -> str:
    """Remove secret values from anything about to be printed: the key, and the value of any
    variable whose name says it is secret (declared secrets are named so, e.g. HF_TOKEN)."""
    for name, value in environ.items():
        value = value.strip()
        if len(value) >= 8 and (name == KEY_ENV or SECRET_NAME.search(name)):
            text = text.replace(value, "<redacted>")
    return text
