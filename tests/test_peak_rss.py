"""scripts/peak_rss.py sums a job's processes: a child holding 300 MB is seen in the peak."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_peak_counts_the_children(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from peak_rss import watch

    job = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                            "\"import time; b = bytearray(300_000_000); b[::4096] = b'x' * len(b[::4096]); "
                            "time.sleep(2)\"])"])
    gb, line = watch(job.pid, str(tmp_path / "rss.log"), every=0.2)
    job.wait()
    assert gb >= 0.3 and len(line.split()) >= 4  # time, total, parent, child
    assert (tmp_path / "rss.log").read_text().splitlines()[-1].startswith("PEAK ")
