"""verl's verdict on an override list, remembered: `check` then `submit` of the same recipe pay
verl's import (~6 s) once.

An entry is keyed by the verl that would run (the interpreter, where verl lies, and the
newest modification time of verl's config code and YAML: a reinstall or an edit of an
editable checkout is a new key), the override list, and the environment values the overrides
can read (the recipe's `env`, and each ${oc.env:NAME} they name). Only verl's "ok" is kept:
a rejection runs verl again, and a bad recipe leaves nothing behind. Entries hold verl's
version and a few resolved values, never an override or a secret.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import List, Mapping, Optional

FORMAT = 2  # bump when the preflight script or what it reports changes
KEEP = 200  # entries; the oldest go first
# Where verl lies, and the newest change to the code and config its checks read; run by the
# recipe's interpreter without importing verl (~40 ms).
_PROBE = """
import importlib.util as u, os, sys
s = u.find_spec("verl")
d = s.submodule_search_locations[0]
t = [os.stat(os.path.join(r, f)).st_mtime_ns for sub in ("trainer/config", "workers/config", "utils")
     for r, _, fs in os.walk(os.path.join(d, sub)) for f in fs if f.endswith((".yaml", ".py"))]
t.append(os.stat(os.path.join(d, "__init__.py")).st_mtime_ns)
print(os.path.realpath(sys.executable), d, len(t), max(t))
"""
_OC_ENV = re.compile(r"oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")


def directory(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(base) / "verl-launch" / "preflight"


def key(python: str, env: Mapping[str, str], overrides: List[str], script: str, recipe_env: Mapping[str, str]) \
        -> Optional[str]:
    """The entry's name, or None when verl cannot be located cheaply (then nothing is cached)."""
    with tempfile.TemporaryDirectory(prefix="verl-launch-probe-") as cwd:
        try:
            proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, cwd=cwd, env=dict(env),
                                  timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    read = sorted({m for ov in overrides for m in _OC_ENV.findall(ov)})
    ident = [FORMAT, proc.stdout.strip(), overrides, sorted(recipe_env.items()),
             [(n, env.get(n)) for n in read], hashlib.sha256(script.encode()).hexdigest(), _files(overrides)]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32]


def get(environ: Mapping[str, str], name: Optional[str]) -> Optional[dict]:
    if not name:
        return None
    try:
        return json.loads((directory(environ) / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def put(environ: Mapping[str, str], name: Optional[str], result: dict) -> None:
    """Keep RESULT (verl said ok); a cache that cannot be written is no error."""
    if not name or not result.get("ok"):
        return
    d = directory(environ)
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps({k: result[k] for k in ("ok", "verl_version", "config", "notes") if k in result}))
        os.replace(tmp, d / f"{name}.json")
        entries = sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def _files(overrides: List[str]) -> list:
    """The contents of the files the overrides name (a tool or agent-loop config the preflight
    reads): edit one and the cached verdict no longer applies. A parquet dataset (the preflight
    reads its agent_name column) by its size and modification time: it may be gigabytes. A
    model is never read."""
    out = []
    for ov in overrides:
        value = ov.partition("=")[2]
        try:
            if value.startswith("/") and value.endswith((".yaml", ".yml", ".json", ".py")) and os.path.isfile(value):
                out.append((value, hashlib.sha256(Path(value).read_bytes()).hexdigest()))
            elif value.startswith("/") and value.endswith(".parquet") and os.path.isfile(value):
                st = os.stat(value)
                out.append((value, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((value, None))
    return out
