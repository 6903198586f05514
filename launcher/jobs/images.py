"""Container images for pyxis/enroot: `verl-launch image import IMAGE` turns an image into a
squashfs on shared storage once, on a login node, so that the nodes of every job mount the
file instead of all pulling the image at once (the slow cold start SUNK users see).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import List

from ..errors import RecipeError, SlurmError

_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")


def enroot_uri(image: str) -> str:
    """'verlai/verl:tag' -> 'docker://verlai/verl:tag'; a registry host is followed by '#'
    in enroot's URIs: 'nvcr.io/nvidia/pytorch:24.01' -> 'docker://nvcr.io#nvidia/pytorch:24.01'."""
    if not _IMAGE.fullmatch(image) or ".." in image:
        raise RecipeError(f"{image!r} is not an image name (e.g. verlai/verl:tag)", where="command line",
                          key="IMAGE")
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return f"docker://{first}#{rest}"
    return f"docker://{image}"


def squashfs_name(image: str) -> str:
    """enroot's own file name for an image: '/' and ':' become '+' ('verlai+verl+tag.sqsh')."""
    return re.sub(r"[/:@#]", "+", image) + ".sqsh"


def import_command(image: str, output_dir: Path) -> List[str]:
    return ["enroot", "import", "--output", str(output_dir / squashfs_name(image)), enroot_uri(image)]


def import_image(image: str, output_dir: Path, dry_run: bool = False) -> Path:
    """Run enroot import, unless the squashfs is already there. Returns its path."""
    cmd = import_command(image, output_dir)
    target = Path(cmd[3])
    if dry_run or target.exists():
        return target
    if shutil.which("enroot") is None:
        raise SlurmError("enroot not found on PATH: run `image import` on a login node with enroot "
                         f"(the command: {shlex.join(cmd)})")
    output_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".sqsh.partial")  # a failed import leaves no file that looks done
    partial.unlink(missing_ok=True)
    proc = subprocess.run([*cmd[:3], str(partial), cmd[4]], stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SlurmError(f"enroot import failed (exit {proc.returncode}): {shlex.join(cmd)}")
    partial.rename(target)
    return target
