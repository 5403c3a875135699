"""Issue 13: the crash matrix on a tiny config (slow): SIGKILL the main job mid-stage and at stage boundaries,
rerun, and results.json equals the uninterrupted run's to 1e-12 with no worker left behind."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_crash_matrix_on_a_tiny_config(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "crash_matrix.py"), "--tiny", "--reuse-stages",
                        "--work", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=7200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "kill point" not in line]
    assert len(rows) == 9 and all(row.rstrip().endswith("| pass |") for row in rows), r.stdout[-4000:]
