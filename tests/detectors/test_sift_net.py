"""SIFT network: padding never leaks; every ablation switch removes its component."""

import pytest
import torch
from torch import nn

from datamodules.batch import TraceBatch
from datamodules.features import ATTENTION_STABILITY, EARLY_COMMITMENT, organism_channel_names
from sift.detectors import SIFTDetector, SIFTNet
from sift.detectors.module import n_parameters
from sift.errors import SiftError

CH = organism_channel_names(4)  # 9 channels
DATA = dict(channel_names=CH, feature_names=["cue/a"], pooled_dim=4, n_envs=3, n_domains=2)


def _inputs(B=4, T=12, C=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g)
    lengths = torch.tensor([12, 9, 5, 1])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return x, mask


def _pad(x, mask, extra, fill):
    B, T, C = x.shape
    xp = torch.cat([x, torch.full((B, extra, C), fill)], 1)
    xp[:, :T][~mask] = fill  # garbage in the existing padding too
    mp = torch.cat([mask, torch.zeros(B, extra, dtype=torch.bool)], 1)
    return xp, mp


def test_padding_does_not_change_eval_outputs():
    torch.manual_seed(0)
    net = SIFTNet(9).eval()  # paper size: TCN [3,5,7,11]×64, 4 layers, 8 heads, d=128
    x, mask = _inputs()
    with torch.no_grad():
        ref, zref = net(x, mask)
        for extra, fill in [(7, 0.0), (20, 123.0), (3, float("1e4"))]:
            out, z = net(*_pad(x, mask, extra, fill))
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(z, zref, atol=1e-5, rtol=1e-5)


def test_padding_does_not_leak_into_training_batchnorm_statistics():
    torch.manual_seed(0)
    net = SIFTNet(9, dropout=0.0).train()
    x, mask = _inputs()
    ref, _ = net(x, mask)
    mean_ref = [bn.running_mean.clone() for bn in net.tcn.norms]
    torch.manual_seed(0)
    net2 = SIFTNet(9, dropout=0.0).train()
    out, _ = net2(*_pad(x, mask, 9, 50.0))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, bn in zip(mean_ref, net2.tcn.norms):
        torch.testing.assert_close(bn.running_mean, a)


def test_length_chunked_training_encoder_is_the_same_function():
    """Training runs the encoder on length-sorted chunks trimmed to their longest trace: with dropout off, the
    logits, pooled representation and every gradient equal one padded call."""
    g = torch.Generator().manual_seed(3)
    B, T = 11, 16
    x = torch.randn(B, T, 9, generator=g)
    lengths = torch.tensor([16, 3, 9, 1, 12, 5, 16, 7, 2, 10, 4])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    outs = []
    for chunk in (0, 3):
        torch.manual_seed(0)
        net = SIFTNet(9, dropout=0.0, encoder_chunk=chunk).train()
        logits, z = net(x, mask)
        (logits.square().sum() + z.sum()).backward()
        outs.append((logits, z, {n: p.grad.clone() for n, p in net.named_parameters()}))
    (l0, z0, g0), (l1, z1, g1) = outs
    torch.testing.assert_close(l1, l0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(z1, z0, atol=1e-5, rtol=1e-5)
    assert g0.keys() == g1.keys()
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-4, rtol=1e-4, msg=n)


def test_paper_architecture_shapes():
    m = SIFTDetector(data=DATA)
    net = m.net
    assert [c.kernel_size[0] for c in net.tcn.convs] == [3, 5, 7, 11]
    assert all(c.out_channels == 64 and c.in_channels == 9 for c in net.tcn.convs)
    assert all(isinstance(n, nn.BatchNorm1d) for n in net.tcn.norms)
    assert len(net.encoder.layers) == 4
    layer = net.encoder.layers[0]
    assert layer.self_attn.num_heads == 8 and layer.self_attn.embed_dim == 128 and layer.dropout.p == 0.1
    assert net.head[0].out_features == 128
    x, mask = _inputs()
    logits, z = m.encode(TraceBatch(x=x, mask=mask, label=torch.zeros(4), env=torch.zeros(4, dtype=torch.long),
                                    domain=torch.zeros(4, dtype=torch.long), model=torch.zeros(4, dtype=torch.long),
                                    pooled=torch.zeros(4, 4), features=torch.zeros(4, 1)))
    assert logits.shape == (4,) and z.shape == (4, 128)


def _count(m, kind):
    return sum(isinstance(x, kind) for x in m.modules())


def test_ablation_switches_remove_components():
    full = SIFTDetector(data=DATA)
    n_full = n_parameters(full)

    no_tcn = SIFTDetector(data=DATA, net={"use_tcn": False})
    assert no_tcn.net.tcn is None and _count(no_tcn, nn.Conv1d) == 0 and _count(full, nn.Conv1d) == 4
    tcn_params = n_parameters(full.net.tcn) + n_parameters(full.net.proj) - n_parameters(no_tcn.net.proj)
    assert n_full - n_parameters(no_tcn) == tcn_params > 0

    no_tr = SIFTDetector(data=DATA, net={"use_transformer": False})
    assert no_tr.net.encoder is None and _count(no_tr, nn.TransformerEncoderLayer) == 0
    assert n_full - n_parameters(no_tr) == n_parameters(full.net.encoder) > 0

    no_dann = SIFTDetector(data=DATA, objective={"use_dann": False})
    assert no_dann.domain_classifier is None
    assert n_full - n_parameters(no_dann) == n_parameters(full.domain_classifier) > 0
    assert full.domain_classifier.net[-1].out_features == 3  # env ids
    assert SIFTDetector(data=DATA, objective={"dann_domain": "domain"}).domain_classifier.net[-1].out_features == 2

    no_as = SIFTDetector(data=DATA, drop_channels=[ATTENTION_STABILITY])
    assert no_as.in_channels == 8 and ATTENTION_STABILITY not in no_as.kept_channels
    assert all(c.in_channels == 8 for c in no_as.net.tcn.convs)
    no_ec = SIFTDetector(data=DATA, drop_channels=[EARLY_COMMITMENT])
    assert no_ec.in_channels == 8 and EARLY_COMMITMENT not in no_ec.kept_channels
    both = SIFTDetector(data=DATA, drop_channels=[ATTENTION_STABILITY, EARLY_COMMITMENT], net={"use_tcn": False})
    assert both.net.proj.in_features == 7
    # the dropped channel really is not read: changing it does not change the output
    x, mask = _inputs()
    b = TraceBatch(x=x, mask=mask, label=torch.zeros(4), env=torch.zeros(4, dtype=torch.long),
                   domain=torch.zeros(4, dtype=torch.long), model=torch.zeros(4, dtype=torch.long),
                   pooled=torch.zeros(4, 4), features=torch.zeros(4, 1))
    no_as.eval()
    ref = no_as(b)
    b.x[..., CH.index(ATTENTION_STABILITY)] += 100.0
    torch.testing.assert_close(no_as(b), ref)


def test_no_irm_switch_skips_the_penalty(monkeypatch):
    import sift.detectors.module as mod

    calls = []
    monkeypatch.setattr(mod, "irm_penalty", lambda l, y: calls.append(1) or l.sum() * 0)
    x, mask = _inputs()
    b = TraceBatch(x=x, mask=mask, label=torch.tensor([0.0, 1, 0, 1]), env=torch.tensor([0, 0, 1, 1]),
                   domain=torch.zeros(4, dtype=torch.long), model=torch.zeros(4, dtype=torch.long),
                   pooled=torch.zeros(4, 4), features=torch.zeros(4, 1))
    for use_irm, expected in [(False, 0), (True, 2)]:
        calls.clear()
        m = SIFTDetector(data=DATA, objective={"use_irm": use_irm},
                         net={"d_model": 16, "filters": 4, "n_layers": 1, "n_heads": 2})
        m.log = lambda *a, **k: None
        m.training_step(b, 0)  # one mixed batch is split by env: two environments
        assert len(calls) == expected


def test_unknown_channel_or_domain_kind_is_a_clear_error():
    from sift.errors import SiftError

    with pytest.raises(SiftError, match="attention_stability"):
        SIFTDetector(data={**DATA, "channel_names": CH[:-1]}, drop_channels=[ATTENTION_STABILITY])
    with pytest.raises(SiftError, match="dann_domain"):
        SIFTDetector(data=DATA, objective={"dann_domain": "task"})
    with pytest.raises(SiftError, match=r"detector.objective: unknown key\(s\) \['irm_lamda'\]"):
        SIFTDetector(data=DATA, objective={"irm_lamda": 2.0})
    with pytest.raises(SiftError, match=r"detector.scheduler: unknown key\(s\) \['warmup'\]"):
        SIFTDetector(data=DATA, scheduler={"warmup": 5})
    with pytest.raises(SiftError, match="_partial_"):
        SIFTDetector(data=DATA, optimizer={"_partial_": False})


@pytest.mark.parametrize("preset,check", [
    ("no_tcn", lambda m: m.net.tcn is None),
    ("no_transformer", lambda m: m.net.encoder is None),
    ("no_irm", lambda m: m.objective.use_irm is False),
    ("no_dann", lambda m: m.domain_classifier is None),
    ("no_attention_stability", lambda m: ATTENTION_STABILITY not in m.kept_channels and m.in_channels == 8),
    ("no_early_commitment", lambda m: EARLY_COMMITMENT not in m.kept_channels and m.in_channels == 8),
])
def test_ablation_presets_switch_off_their_component(compose_train, preset, check):
    """`sift-train ablation=<preset>` builds the detector without that component (configs/ablation/)."""
    from sift.training import DETECTOR_RUN_KEYS, instantiate_node

    full = instantiate_node(compose_train("detector=sift").detector, exclude=DETECTOR_RUN_KEYS, data=DATA)
    m = instantiate_node(compose_train("detector=sift", f"ablation={preset}").detector, exclude=DETECTOR_RUN_KEYS,
                         data=DATA)
    assert check(m) and not check(full)
    if preset not in ("no_irm",):  # IRM has no parameters; the others remove weights
        assert n_parameters(m) < n_parameters(full)


def test_the_optimizer_is_the_configured_partial(compose_train):
    """detector.optimizer builds the optimizer (Adam by default) on the detector's and the domain classifier's
    parameter groups; detector.scheduler wraps it in the warm-up + cosine LambdaLR."""
    from sift.training import DETECTOR_RUN_KEYS, instantiate_node

    def build(*overrides):
        cfg = compose_train("detector=sift", *overrides).detector
        return instantiate_node(cfg, exclude=DETECTOR_RUN_KEYS, data=DATA)

    m = build("detector.optimizer.weight_decay=0.01")
    out = m.configure_optimizers()
    opt = out["optimizer"]
    assert type(opt) is torch.optim.Adam and opt.defaults["weight_decay"] == 0.01
    assert [g["initial_lr"] for g in opt.param_groups] == [1e-3, 1e-3]  # dann_lr_mult 1
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(m.parameters()))
    assert type(out["lr_scheduler"]["scheduler"]) is torch.optim.lr_scheduler.LambdaLR
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 21)  # step 0 of the 20-step warm-up
    sgd = build("detector.optimizer._target_=torch.optim.SGD", "detector.optimizer.lr=0.1",
                "detector.scheduler.warmup_steps=0", "detector.scheduler.kind=constant")
    opt = sgd.configure_optimizers()
    assert type(opt) is torch.optim.SGD and [g["lr"] for g in opt.param_groups] == [0.1, 0.1]


def test_checkpointed_encoder_gives_the_same_numbers_with_dropout_on():
    """checkpoint_from_steps recomputes the encoder in the backward pass with dropout's RNG state replayed: logits,
    representation and every gradient are bit for bit those of the stored-activation run, and the RNG stream after
    the step is the same (the next step draws the same masks)."""
    g = torch.Generator().manual_seed(5)
    B, T = 9, 12
    x = torch.randn(B, T, 9, generator=g)
    lengths = torch.tensor([12, 3, 9, 1, 12, 5, 7, 2, 10])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    outs = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        net = SIFTNet(9, dropout=0.3, encoder_chunk=4, checkpoint_from_steps=12 if ckpt else None).train()
        logits, z = net(x, mask)
        (logits.square().sum() + z.sum()).backward()
        outs.append((logits, z, {n: p.grad.clone() for n, p in net.named_parameters()}, torch.rand(3)))
    (l0, z0, g0, r0), (l1, z1, g1, r1) = outs
    assert torch.equal(l0, l1) and torch.equal(z0, z1) and torch.equal(r0, r1)
    assert g0.keys() == g1.keys() and all(torch.equal(g0[n], g1[n]) for n in g0)


def test_encoder_is_recomputed_only_in_batches_with_a_trace_that_long(monkeypatch):
    """checkpoint_from_steps=N: a training batch whose longest trace has >= N steps runs every encoder chunk under
    torch.utils.checkpoint; a shorter batch, evaluation and N=None never do; N < 1 is refused by name."""
    import torch.utils.checkpoint as tuc

    calls = []
    real = tuc.checkpoint
    monkeypatch.setattr(tuc, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    lengths = torch.tensor([12, 3, 9, 1, 12, 5, 7, 2, 10])
    x = torch.randn(9, 12, 9)

    def n_calls(net, max_len, grad=True):
        calls.clear()
        mask = torch.arange(12)[None, :] < lengths.clamp(max=max_len)[:, None]
        with torch.set_grad_enabled(grad):
            net(x, mask)
        return len(calls)

    net = SIFTNet(9, encoder_chunk=4, checkpoint_from_steps=10).train()
    assert n_calls(net, 12) == 3  # longest 12 >= 10: all three chunks of 4, 4, 1 traces
    assert n_calls(net, 9) == 0  # longest 9 < 10
    assert n_calls(net, 12, grad=False) == 0
    assert n_calls(SIFTNet(9, encoder_chunk=4).train(), 12) == 0
    with pytest.raises(SiftError, match="checkpoint_from_steps"):
        SIFTNet(9, checkpoint_from_steps=0)


def test_detectors_take_the_data_spec_as_one_argument(tmp_path):
    """Every detector takes ``data`` (a DataSpec or its dict); its checkpoint holds the dict and loads as data."""
    from sift.detectors import load_detector
    from sift.detectors.module import DataSpec
    from sift.errors import SiftError

    spec = DataSpec(**DATA)
    m = SIFTDetector(data=spec)
    assert m.hparams["data"] == spec.as_dict() and m.channel_names == CH and m.n_classes["domain"] == 2
    assert SIFTDetector(data=spec.as_dict()).hparams["data"] == spec.as_dict()
    import pytorch_lightning as pl

    trainer = pl.Trainer(max_epochs=0, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(m)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    ck = torch.load(tmp_path / "m.ckpt", weights_only=True)
    ck["sift_detector"] = {"class": "sift.detectors.sift_model.SIFTDetector"}
    torch.save(ck, tmp_path / "m.ckpt")
    assert load_detector(str(tmp_path / "m.ckpt")).channel_names == CH
    with pytest.raises(SiftError, match=r"unknown key\(s\) \['n_env'\]"):
        SIFTDetector(data={"n_env": 2})
