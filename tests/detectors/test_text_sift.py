"""The ``text_sift`` control: SIFT's network on learned token embeddings. It can read an interaction of two tokens
(an XOR at fixed positions, which no linear reader can), it never reads the hidden states, its token steps follow
the descriptor steps, and it is registered as a control everywhere the other controls are."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from datamodules.batch import TraceBatch, TraceExample, collate
from datamodules.token_steps import bins, pad_token_steps, record_token_steps, token_steps
from sift.config import compose
from sift.detectors.module import as_env_batches, concat_batches
from sift.detectors.registry import is_control
from sift.detectors.text_sift import TextSIFTDetector, TokenStepEmbedding
from sift.metrics import auroc

SMALL_NET = ["detector.net.filters=16", "detector.net.d_model=32", "detector.net.n_layers=1", "detector.net.n_heads=2",
             "detector.net.dim_feedforward=64", "detector.net.mlp_hidden=32", "detector.tokens.dim=16"]


def shipped(overrides=(), **data):
    """A text_sift detector built from configs/detector/text_sift.yaml (the shipped network unless overridden)."""
    from sift.training import DETECTOR_RUN_KEYS

    node = OmegaConf.to_container(compose("train", ["detector=text_sift", "paths.output_dir=.", *overrides]).detector,
                                  resolve=True)
    for k in (*DETECTOR_RUN_KEYS, "_target_"):
        node.pop(k, None)
    return TextSIFTDetector(**node, data=data or None)


def xor_batch(n: int, g: torch.Generator) -> TraceBatch:
    """Eight CoT steps of one token from {1..6}; steps 1 and 3 hold 1 or 2 (which also occur anywhere else).
    φ* = (step 1 holds 1) XOR (step 3 holds 1): readable only from two positions together."""
    ids = torch.randint(1, 7, (n, 8), generator=g)
    ids[:, 1] = torch.randint(1, 3, (n,), generator=g)
    ids[:, 3] = torch.randint(1, 3, (n,), generator=g)
    y = ((ids[:, 1] == 1) ^ (ids[:, 3] == 1)).float()
    z = torch.zeros(n, dtype=torch.long)
    return TraceBatch(x=torch.randn(n, 8, 3, generator=g), mask=torch.ones(n, 8, dtype=torch.bool), label=y, env=z,
                      domain=z, model=z, pooled=torch.randn(n, 4, generator=g), features=torch.randn(n, 2, generator=g),
                      token_ids=ids[..., None], token_segment=torch.ones(n, 8, dtype=torch.long))


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_shipped_text_sift_reads_an_xor_of_two_tokens_that_no_linear_reader_can(one_thread):
    from sklearn.linear_model import LogisticRegression

    torch.manual_seed(0)
    # the shipped network (SIFT's sizes; a small hash table: the ids are < 7), plain Adam steps on the logit
    det = shipped(["detector.tokens.buckets=64"])
    g = torch.Generator().manual_seed(1)
    test = xor_batch(400, g)
    opt = torch.optim.Adam(det.parameters(), lr=1e-3)
    best = 0.0
    for step in range(150):
        det.train()
        b = xor_batch(64, g)
        loss = F.binary_cross_entropy_with_logits(det.encode(b)[0], b.label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 24:
            det.eval()
            with torch.no_grad():
                best = auroc(det(test).numpy(), test.label.numpy())
            if best >= 0.95:
                break
    assert best >= 0.9, best
    # a linear reader of position-specific one-hot tokens (richer than a bag of words) stays at chance
    train = xor_batch(2000, g)

    def onehot(b):
        return F.one_hot(b.token_ids[..., 0], 7).reshape(len(b), -1).float().numpy()

    lr = LogisticRegression(max_iter=2000).fit(onehot(train), train.label.numpy())
    assert auroc(lr.predict_proba(onehot(test))[:, 1], test.label.numpy()) <= 0.65


def test_forward_reads_the_tokens_only():
    torch.manual_seed(0)
    det = shipped(SMALL_NET).eval()
    g = torch.Generator().manual_seed(2)
    b = xor_batch(16, g)
    with torch.no_grad():
        p = det(b)
        other = TraceBatch(x=torch.randn(16, 5, 9) * 100, mask=torch.rand(16, 5) < 0.5, label=b.label, env=b.env,
                           domain=b.domain, model=b.model, pooled=torch.randn(16, 4) * 100,
                           features=torch.randn(16, 2) * 100, prompt_pooled=torch.randn(16, 4),
                           token_ids=b.token_ids, token_segment=b.token_segment)
        torch.testing.assert_close(det(other), p, rtol=0, atol=0)
        ids = b.token_ids.clone()
        ids[:, 1] = 3 - ids[:, 1]  # another token at step 1: the output moves
        moved = TraceBatch(**{**b.__dict__, "token_ids": ids})
        assert not torch.allclose(det(moved), p)
        # padding (a wider step, extra empty steps) changes nothing in eval mode
        pid, pseg = pad_token_steps([b.token_ids], [b.token_segment], S=12, K=3)
        torch.testing.assert_close(det(TraceBatch(**{**b.__dict__, "token_ids": pid, "token_segment": pseg})), p,
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(Exception, match="token ids"):
        det(TraceBatch(**{**b.__dict__, "token_ids": None}))


def test_step_embedding_means_the_tokens_and_counts_positions_within_segments():
    emb = TokenStepEmbedding(buckets=10, dim=4, max_positions=3)
    ids = torch.tensor([[[3, 5], [13, -1], [7, -1], [2, -1], [-1, -1]]])  # 13 hashes onto row 3
    seg = torch.tensor([[0, 0, 1, 1, -1]])
    x, mask = emb(ids, seg)
    assert mask.tolist() == [[True, True, True, True, False]]
    T, S, P = emb.token.weight, emb.segment.weight, emb.position.weight
    torch.testing.assert_close(x[0, 0], (T[3] + T[5]) / 2 + S[0] + P[0])
    torch.testing.assert_close(x[0, 1], T[3] + S[0] + P[1])
    torch.testing.assert_close(x[0, 3], T[2] + S[1] + P[1])  # the second step of the CoT segment
    assert x[0, 4].abs().sum() == 0


def test_token_steps_bin_like_the_descriptors():
    from sift.trajectories.descriptors import bin_index

    for n, m in [(7, 3), (12, 12), (20, 6), (5, 9)]:
        idx, _ = bin_index(torch.tensor([n]), n, m)
        want = [[t for t in range(n) if idx[0, t] == b] for b in range(min(n, m))]
        assert bins(list(range(n)), m) == want
    ids, seg = token_steps([1, 2, 3], [4, 5, 6, 7, 8], [9, 10], cot_steps=2, prompt_steps=64, answer_steps=1)
    assert seg.tolist() == [0, 0, 0, 1, 1, 2]
    assert ids.tolist() == [[1, -1, -1], [2, -1, -1], [3, -1, -1], [4, 5, 6], [7, 8, -1], [9, 10, -1]]
    rec = {"prompt_ids": [1, 2], "generated_ids": [50, 4, 5, 9], "cot_span": [1, 3]}  # one token before the CoT
    ids, seg = record_token_steps(rec, cot_steps=2)
    assert ids[:, 0].tolist() == [1, 2, 50, 4, 5, 9] and seg.tolist() == [0, 0, 0, 1, 1, 2]


def test_token_fields_survive_collate_concat_and_env_split():
    def ex(env, S, K):
        return TraceExample(x=torch.zeros(2, 1), label=1, env=env, domain=0, model=0, pooled=torch.zeros(2),
                            features=torch.zeros(1), token_ids=torch.full((S, K), env + 1, dtype=torch.int32),
                            token_segment=torch.ones(S, dtype=torch.int8))

    a, b = collate([ex(0, 3, 1), ex(0, 5, 2)]), collate([ex(1, 4, 3)])
    assert a.token_ids.shape == (2, 5, 2) and a.token_ids[0, 3:].eq(-1).all() and a.token_segment[0, 3:].eq(-1).all()
    c = concat_batches([a, b])
    assert c.token_ids.shape == (3, 5, 3) and c.token_ids[2, :4].eq(2).all()
    parts = as_env_batches(c)
    assert [p.token_ids[:, 0, 0].tolist() for p in parts] == [[1, 1], [2]]
    assert collate([TraceExample(x=torch.zeros(1, 1), label=0, env=0, domain=0, model=0, pooled=torch.zeros(1),
                                 features=torch.zeros(1))]).token_ids is None


def test_text_sift_is_registered_as_a_control_of_every_preset():
    from sift.detectors.registry import detector_entries
    from sift.faithshift import plan_runs

    assert is_control("text_sift") and is_control("text_sift (ensemble)")
    assert not is_control("sift") and not is_control("instance_ensemble") and not is_control("sift [no_irm]")
    assert all(is_control(c) for c in ("text_bow", "surface", "prompt_probe"))
    e = detector_entries(["text_sift"])["text_sift"]
    assert (e.target, e.objective, e.reference, e.ablations, e.factorial, e.cost) == (
        "sift.detectors.text_sift.TextSIFTDetector", "irm_dann", False, False, False, 10.0)
    sift_cfg = compose("train", ["detector=sift", "paths.output_dir=."]).detector
    ts_cfg = compose("train", ["detector=text_sift", "paths.output_dir=."]).detector
    for key in ("net", "optimizer", "scheduler", "objective", "early_stopping"):  # SIFT's network and schedule
        ts, sf = OmegaConf.to_container(ts_cfg[key]), OmegaConf.to_container(sift_cfg[key])
        if key == "net":  # a memory setting (the same numbers: test_sift_net.py), on for text_sift's long inputs
            assert ts.pop("checkpoint_from_steps") == 96 and sf.pop("checkpoint_from_steps", None) is None
        assert ts == sf, key
    for preset in ("full", "quick", "paper", "real_small", "real_paper"):
        cfg = compose("faithshift", [f"preset={preset}", "paths.output_dir=/tmp/x", "transfer.holdout_models=[a]"])
        assert list(cfg.controls) == ["text_bow", "surface", "prompt_probe", "text_sift", "output_confidence"], preset
        for cap in ("max_epochs_by_detector", "max_steps_by_detector"):  # SIFT's caps apply to it too
            caps = cfg.get(cap) or {}
            assert caps.get("text_sift") == caps.get("sift"), (preset, cap)
    cfg = compose("faithshift", ["paths.output_dir=/tmp/x", "seeds=[0,1]", "mechanisms=null"])
    runs = [r for r in plan_runs(cfg) if r.detector == "text_sift"]
    assert [r.key for r in runs] == ["main/text_sift/seed0", "main/text_sift/seed1"]  # no transfer runs, like
    assert all(r.tags == {"control": "true"} and r.cost == 10.0 for r in runs)        # the other controls

