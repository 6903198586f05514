"""Where the shipped templates and recipes are: inside the package in a wheel, at the
repository's top level in a checkout (editable install)."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"verl-launch is installed without its {name}/ directory")


def templates_dir() -> Path:
    return _find("templates")


def shipped_recipes_dir() -> Path:
    return _find("recipes")
