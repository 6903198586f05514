"""`pip install ARGS` into this interpreter's environment, through uv where uv can be had.

    .venv/bin/python tests/tools/pip_install.py -e '.[test]'

uv installs the same versions from the same places, their bytecode compiled as pip's is, in about
half pip's time (docs/testing.md has the figures). It does not read pip's configuration, so
pip's own (`pip config list`, with PIP_* variables first: index,
extra indexes, find-links, constraints, trusted hosts, the CA file) is handed to it as flags, and
it takes the best version across the indexes, as pip does. pip itself does the install where uv
cannot be installed or fails, or with VERL_LAUNCH_PIP=1. Used by `make install` and `make
node-env`; the launcher's own install (`pip install verl-launch`) needs none of it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

# pip's option -> uv's flag (each value of a list option a flag of its own)
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}
SECTIONS = (":env:", "install", "global")  # pip's precedence: its variables, then [install], then [global]


def pip_config() -> dict:
    """pip's effective values for FLAGS and `cert`, as `pip config list` prints them."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    seen: dict = {}
    for line in out.splitlines():
        key, eq, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if eq and section in SECTIONS:
            seen.setdefault(name, {})[section] = value.strip().strip("'\"")
    return {name: next(by[s] for s in SECTIONS if s in by) for name, by in seen.items()}


def uv_command(args: list, config: dict) -> list:
    # --compile-bytecode: as pip does at install; without it (and with PYTHONDONTWRITEBYTECODE, as
    # on this machine kind) every process compiles torch, vLLM and verl from source at each import
    cmd = [str(Path(sys.executable).parent / "uv"), "pip", "install", "-q", "--python", sys.executable,
           "--index-strategy", "unsafe-best-match", "--compile-bytecode"]
    for name, flag in FLAGS.items():
        for value in config.get(name, "").split():
            cmd += [flag, value]
    return cmd + args


def main(args: list) -> int:
    pip = [sys.executable, "-m", "pip", "install", "-q", *args]
    if os.environ.get("VERL_LAUNCH_PIP") != "1":
        config = pip_config()
        env = dict(os.environ, **({"SSL_CERT_FILE": config["cert"]} if config.get("cert") else {}))
        got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "uv"]).returncode == 0
        if got and subprocess.run(uv_command(args, config), env=env).returncode == 0:
            return 0
        print(f"uv could not install {shlex.join(args)}; pip does", file=sys.stderr, flush=True)
    return subprocess.run(pip).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
