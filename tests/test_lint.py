"""The repository is clean under its ruff configuration (``[tool.ruff]`` in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: install the dev extra (pip install -e '.[dev]')")
    run = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, f"ruff check found problems:\n{run.stdout}{run.stderr}"
