"""Corpus chunks as jobs on the execution engine: the corpus is byte-identical for any number of local worker
processes, a failed chunk is retried once with its traceback logged, and finished chunks are never rebuilt."""

import json
from functools import partial
from pathlib import Path

import pytest

from sift.corpus.config import OrganismCorpusConfig
from sift.corpus.sources.organism import build_corpus
from sift.corpus.store import engine_config, read_jsonl, run_chunks
from sift.errors import SiftError

ROOT = Path(__file__).resolve().parents[2]
CKPT = str(ROOT / "checkpoints" / "organism")


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("traces.jsonl", "pairs.jsonl")}


def _manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    m.pop("seconds")
    return m


def test_workers_give_a_byte_identical_corpus(tmp_path):
    # small and fast: one organism family, one audit seed; 3 chunks of 2 items
    cfg = OrganismCorpusConfig(n_items=6, chunk_items=2, checkpoint_dir=CKPT, families=["gpt2"], audit_seeds=1)
    serial = build_corpus(cfg, tmp_path / "w1", progress=False, engine=engine_config(None, 1))
    pooled = build_corpus(cfg, tmp_path / "w2", progress=False, engine=engine_config(None, 2))
    assert serial["traces"] > 0 and serial["chunks_reused"] == pooled["chunks_reused"] == 0
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2")
    assert _manifest(tmp_path / "w1") == _manifest(tmp_path / "w2")
    assert len(list((tmp_path / "w2" / ".parts").glob("chunk-*.jsonl"))) == 3
    again = build_corpus(cfg, tmp_path / "w2", progress=False, engine=engine_config(None, 2))
    assert again["chunks_reused"] == 3 and _files(tmp_path / "w2") == _files(tmp_path / "w1")


def flaky_chunk(marker_dir: str, chunk: list[int]) -> list[dict]:
    """A picklable stand-in chunk builder: fails once for a chunk whose marker file exists."""
    marker = Path(marker_dir) / f"fail-once-{chunk[0]}"
    if marker.exists():
        marker.unlink()
        raise RuntimeError(f"transient failure of the chunk starting at {chunk[0]}")
    if (Path(marker_dir) / f"fail-always-{chunk[0]}").exists():
        raise RuntimeError(f"permanent failure of the chunk starting at {chunk[0]}")
    return [{"item": i} for i in chunk]


CHUNKS = [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_chunk_is_retried_once_and_its_log_named(tmp_path, capsys, workers):
    (tmp_path / "fail-once-2").touch()
    parts = tmp_path / ".parts"
    recs, reused = run_chunks(CHUNKS, parts, "h", partial(flaky_chunk, str(tmp_path)), desc="chunks",
                              progress=False, engine=engine_config(None, workers))
    assert recs == [{"item": i} for i in range(6)] and reused == 0  # chunk order, whatever finished first
    log = parts / "logs" / "0001" / "failed-attempt1.log"
    assert "transient failure of the chunk starting at 2" in log.read_text()
    assert f"[corpus] chunk 0001 failed (attempt 1/2), log {log}" in capsys.readouterr().out
    assert read_jsonl(parts / "chunk-0001-h.jsonl") == [{"item": 2}, {"item": 3}]


def test_a_chunk_failing_twice_stops_the_build_and_keeps_finished_chunks(tmp_path):
    (tmp_path / "fail-always-4").touch()
    parts = tmp_path / ".parts"
    with pytest.raises(RuntimeError, match="permanent failure of the chunk starting at 4"):
        run_chunks(CHUNKS, parts, "h", partial(flaky_chunk, str(tmp_path)), desc="chunks", progress=False)
    assert (parts / "logs" / "0002" / "failed-attempt2.log").exists()
    assert sorted(p.name for p in parts.glob("chunk-*")) == ["chunk-0000-h.jsonl", "chunk-0001-h.jsonl"]
    (tmp_path / "fail-always-4").unlink()
    built = []
    recs, reused = run_chunks(CHUNKS, parts, "h", lambda c: built.append(c) or flaky_chunk(str(tmp_path), c),
                              desc="chunks", progress=False)
    assert reused == 2 and built == [[4, 5]] and len(recs) == 6


def test_engine_config_is_checked():
    with pytest.raises(SiftError, match="workers: expected a positive integer, got 0"):
        engine_config(None, 0)
