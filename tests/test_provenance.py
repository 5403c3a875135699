"""Provenance fingerprints: a model's fingerprint follows its weights, so caches never reuse stale outputs."""

from sift.provenance import config_hash, model_fingerprint


def test_fingerprint_changes_with_the_weights(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}')
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    before = model_fingerprint(str(folder))
    assert model_fingerprint(str(folder)) == before
    (folder / "model.safetensors").write_bytes(b"\x00" * 63 + b"\x01")
    assert model_fingerprint(str(folder)) != before
    assert model_fingerprint("org/name") == model_fingerprint("org/name") != model_fingerprint("org/other")


def test_config_hash_is_order_independent():
    assert (config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
            != config_hash({"a": 2, "b": [1, 2]}))
