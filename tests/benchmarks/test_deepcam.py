"""DeepCAM: model shapes, the IoU metric, loss, LAMB, schedules, the file layout, the loaders and
the one-line errors on bad files."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from mlhpc.benchmarks.deepcam import data, functions, model, synthetic, train
from mlhpc.benchmarks.deepcam.config import DeepCamConfig
from mlhpc.common.cluster.distributed import init_distributed
from mlhpc.common.contract import registry
from mlhpc.common.contract.config import load_config
from mlhpc.common.errors import DataError
from mlhpc.common.training.schedules import WarmupSchedule

# DeepLabv3_plus(n_input=16, n_classes=3, os=16) of mlcommons/hpc deepcam/src/deepCam/architecture/
# deeplab_xception.py, counted with that code: sum(p.numel() for p in net.parameters()).
REFERENCE_PARAMETERS = 56_454_720
SMALL = ["data.height=32", "data.width=48", "data.num_train_samples=8", "data.num_eval_samples=4"]


def parameter_count(net: torch.nn.Module) -> int:
    """Trainable parameters (the reference's count)."""
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


def make_cfg(*overrides: str, name: str = "mini") -> DeepCamConfig:
    return load_config(DeepCamConfig, registry.get("deepcam").config_path(name), overrides)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 train and 4 validation samples of 32 x 48 x 16 in the reference HDF5 layout."""
    root = tmp_path_factory.mktemp("deepcam") / "data"
    return data.generate(make_cfg(*SMALL), root, seed=5)


def copy_dataset(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------- model
def test_mini_model_maps_fields_to_class_logits_at_input_size() -> None:
    net = model.build_model(make_cfg())
    out = net(torch.randn(2, 16, 96, 144))
    assert out.shape == (2, 3, 96, 144)
    assert parameter_count(net) < 1_000_000  # CPU-sized (520k at width 1/8)


def test_full_model_has_the_reference_size_and_output_shape() -> None:
    with torch.device("meta"):  # shapes and parameters without the 56M-parameter compute
        net = model.build_model(make_cfg(name="full"))
        out = net(torch.empty(1, 16, 768, 1152))
    assert out.shape == (1, 3, 768, 1152)
    assert parameter_count(net) == REFERENCE_PARAMETERS


def test_input_not_a_multiple_of_the_output_stride_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of the output stride 16"):
        model.build_model(make_cfg())(torch.randn(1, 16, 40, 48))
    with pytest.raises(Exception, match=r"multiples of model\.output_stride=16"):
        make_cfg("data.height=100")


# ---------------------------------------------------------------- metric, loss, optimizer
class FixedPrediction(torch.nn.Module):
    """A 'model' whose logits pick the given class map."""

    def __init__(self, prediction: torch.Tensor) -> None:
        super().__init__()
        self.prediction = prediction

    def forward(self, fields: torch.Tensor) -> torch.Tensor:
        return F.one_hot(self.prediction, 3).permute(0, 3, 1, 2).float()


def test_iou_matches_a_hand_computed_case() -> None:
    target = torch.tensor([[[0, 0, 1], [2, 2, 0]], [[0, 0, 0], [2, 2, 2]]])
    prediction = torch.tensor([[[0, 1, 1], [2, 2, 2]], [[0, 0, 2], [2, 2, 2]]])
    # Sample 0: background 1/3, cyclone 1/2, river 2/3. Sample 1: background 2/3, cyclone absent
    # from both (counts 1, as the reference's nan_to_num), river 3/4.
    expected = [(1 / 3 + 1 / 2 + 2 / 3) / 3, (2 / 3 + 1 + 3 / 4) / 3]
    assert data.iou_per_sample(prediction, target).tolist() == pytest.approx(expected)
    ctx = init_distributed("auto", "cpu")
    loader = [(torch.zeros(1, 16, 2, 3), target[i : i + 1]) for i in range(2)]
    value = data.evaluate(FixedPrediction(prediction[:1]), loader[:1], ctx)
    assert value == pytest.approx(expected[0])
    perfect = data.evaluate(FixedPrediction(target), [(torch.zeros(2, 16, 2, 3), target)], ctx)
    assert perfect == pytest.approx(1.0)


def test_loss_is_the_reference_weighted_cross_entropy() -> None:
    cfg = make_cfg(*SMALL)
    net = model.build_model(cfg)
    weights = [f**-0.125 for f in (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)]
    assert net.loss_weights.tolist() == pytest.approx(weights)
    fields, label = torch.randn(2, 16, 32, 48), torch.randint(0, 3, (2, 32, 48))
    loss = train.compute_loss(net, (fields, label))
    log_p = torch.log_softmax(net(fields), dim=1)
    per_pixel = -log_p.gather(1, label[:, None])[:, 0] * torch.tensor(weights)[label]
    assert loss.item() == pytest.approx(per_pixel.mean().item(), rel=1e-5)


def paper_lamb(params, grads_per_step, *, lr, betas, eps, wd, max_grad_norm):
    """LAMB (You et al., ICLR 2020, Algorithm 2, phi = identity) with apex's global-norm clip."""
    beta1, beta2 = betas
    params = [p.clone().double() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
        clip = max(norm / max_grad_norm, 1.0)
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            g = g.double() / clip
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            r = (m[i] / (1 - beta1**t)) / ((v[i] / (1 - beta2**t)).sqrt() + eps) + wd * p
            params[i] = p - lr * p.norm() / r.norm() * r
    return params


@pytest.mark.parametrize("grad_scale", [0.01, 100.0], ids=["unclipped", "clipped"])
def test_lamb_follows_the_paper_update_rule(grad_scale: float) -> None:
    cfg = make_cfg(*SMALL, "optimizer.lr=0.05", "optimizer.weight_decay=0.01", "optimizer.warmup_steps=0")
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    start = [p.detach().clone() for p in layer.parameters()]
    grads = [[torch.randn(p.shape, generator=gen) * grad_scale for p in start] for _ in range(3)]
    optimizer, _ = train.build_optimizer(cfg, layer, None, 1)
    for step in grads:
        for p, g in zip(layer.parameters(), step, strict=True):
            p.grad = g.clone()
        optimizer.step()
    expected = paper_lamb(start, grads, lr=0.05, betas=(0.9, 0.999), eps=1e-6, wd=0.01, max_grad_norm=1.0)
    for got, want in zip(layer.parameters(), expected, strict=True):
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-7)


def test_schedules_warm_up_then_decay_by_optimizer_step() -> None:
    multistep = WarmupSchedule(kind="multistep", warmup_steps=4, milestones=(3, 6), decay_rate=0.1)
    assert [multistep(t) for t in (0, 2, 4, 6, 7, 9, 10)] == pytest.approx([0, 0.5, 1, 1, 0.1, 0.1, 0.01])
    warm_from_base = WarmupSchedule(kind="multistep", warmup_steps=2, warmup_factor=3.0)
    assert [warm_from_base(t) for t in (0, 1, 2, 5)] == pytest.approx([1, 2, 3, 3])
    cosine = WarmupSchedule(kind="cosine_annealing", warmup_steps=0, t_max=10, eta_min_ratio=0.1)
    assert [cosine(t) for t in (0, 5, 10)] == pytest.approx([1, 0.55, 0.1])


def test_adamw_with_cosine_annealing_steps_the_lr_per_optimizer_step() -> None:
    cfg = make_cfg(
        *SMALL,
        "optimizer.name=AdamW",
        "optimizer.scheduler=cosine_annealing",
        "optimizer.lr=0.002",
        "optimizer.warmup_steps=2",
        "optimizer.t_max=4",
        "optimizer.eta_min=0.0002",
    )
    optimizer, scheduler = train.build_optimizer(cfg, torch.nn.Linear(2, 2), None, 10)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["eps"] == 1e-6
    lrs = []
    for _ in range(7):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # Warm-up from 0 over 2 steps, then the cosine from 0.002 down to eta_min over t_max=4 steps.
    assert lrs == pytest.approx([0.0, 0.001, 0.002, 0.0017364, 0.0011, 0.0004636, 0.0002], rel=1e-4)


# ---------------------------------------------------------------- MLLOG hyperparameters
def official_rules(name: str) -> list[dict]:
    import mlperf_logging

    folder = Path(mlperf_logging.__file__).parent / "compliance_checker" / "hpc_3.0.0"
    return [item["KEY"] for item in yaml.safe_load((folder / name).read_text()) if "KEY" in item]


@pytest.mark.parametrize(
    "overrides, rule_files",
    [
        ((), ["closed_deepcam_lamb.yaml", "closed_deepcam_multistep.yaml"]),
        (
            ("optimizer.name=AdamW", "optimizer.scheduler=cosine_annealing", "optimizer.t_max=9000"),
            ["closed_deepcam_cosine_annealing.yaml"],
        ),
    ],
    ids=["lamb-multistep", "adamw-cosine"],
)
def test_logged_hyperparameters_pass_the_official_rules(overrides, rule_files) -> None:
    """Every key closed_deepcam*.yaml requires (except those the shared loop logs) is there and
    its CHECK expression, evaluated as the compliance checker does, holds."""
    ctx = init_distributed("auto", "cpu")
    logged = train.hyperparameters(make_cfg(*overrides, name="full"), ctx)
    by_loop = {"seed", "train_samples", "eval_samples", "eval_accuracy"}
    for rule in official_rules("closed_deepcam.yaml") + [r for f in rule_files for r in official_rules(f)]:
        if rule["NAME"] in by_loop:
            continue
        assert rule["NAME"] in logged, rule["NAME"]
        checks = rule.get("CHECK", [])
        for check in [checks] if isinstance(checks, str) else checks:
            assert eval(check, {"math": math}, {"v": {"value": logged[rule["NAME"]]}}), (rule["NAME"], check)
    assert logged["opt_name"] == overrides[0].split("=")[1] if overrides else logged["opt_name"] == "LAMB"


# ---------------------------------------------------------------- files and loaders
def test_generated_files_have_the_reference_layout(small_data: Path) -> None:
    for split, count in (("train", 8), ("validation", 4)):
        files = sorted((small_data / split).glob("data-*.h5"))
        assert len(files) == count
        with h5py.File(files[0], "r") as handle:
            assert handle["climate/data"].shape == (32, 48, 16)
            assert handle["climate/data"].dtype == np.float32
            assert handle["climate/labels_0"].shape == (32, 48)
            assert set(np.unique(handle["climate/labels_0"][...])) <= {0, 1, 2}
    with h5py.File(small_data / "stats.h5", "r") as stats:
        assert stats["climate/minval"].shape == stats["climate/maxval"].shape == (16,)
    data.validate_dataset(make_cfg(*SMALL), small_data)


def test_class_maps_follow_from_the_fields() -> None:
    """Cyclones are pressure lows, rivers are moist filaments: one channel each separates them."""
    rng = np.random.default_rng(3)
    samples = [synthetic.synthesize_sample(rng, 96, 144, 16) for _ in range(20)]
    fields = np.stack([f for f, _ in samples])
    labels = np.stack([lab for _, lab in samples])
    psl, tmq = fields[..., 2], fields[..., 6]
    assert (labels == 1).any() and (labels == 2).any()
    assert psl[labels == 1].mean() < psl[labels == 0].mean() - 2 * psl[labels == 0].std()
    assert tmq[labels == 2].mean() > tmq[labels == 0].mean() + tmq[labels == 0].std()


def test_loader_normalises_with_stats_and_puts_channels_first(small_data: Path) -> None:
    cfg = make_cfg(*SMALL, "loop.global_batch_size=4")
    stats = data.read_stats(small_data, 16)
    dataset = data.DeepCamFiles(small_data / "train", file_format="hdf5", stats=stats)
    fields, label = dataset[2]
    with h5py.File(dataset.pairs[2][0], "r") as handle:
        raw, raw_label = handle["climate/data"][...], handle["climate/labels_0"][...]
    with h5py.File(small_data / "stats.h5", "r") as handle:
        lo, hi = handle["climate/minval"][...], handle["climate/maxval"][...]
    assert fields.shape == (16, 32, 48) and fields.dtype == torch.float32 and label.dtype == torch.int64
    assert fields[6, 5, 7].item() == pytest.approx((raw[5, 7, 6] - lo[6]) / (hi[6] - lo[6]), rel=1e-5)
    assert torch.equal(label, torch.from_numpy(raw_label.astype(np.int64)))
    assert fields.min() >= 0.0 and fields.max() <= 1.0  # training stats span the training samples
    bundle = functions.FUNCTIONS.build_data(cfg, small_data, init_distributed("auto", "cpu"), seed=1)
    assert (bundle.train_samples, bundle.eval_samples, len(bundle.train)) == (8, 4, 2)
    x, y = next(iter(bundle.train))
    assert x.shape == (4, 16, 32, 48) and y.shape == (4, 32, 48)


def test_numpy_variant_reads_the_same_samples(small_data: Path, tmp_path: Path) -> None:
    cfg = make_cfg(*SMALL, "data.format=numpy")
    root = data.generate(cfg, tmp_path / "npy", seed=5)  # the same seed as small_data
    assert sorted(p.name for p in (root / "validation").iterdir())[:2] == [
        "data-synth-validation-000000.npy",
        "data-synth-validation-000001.npy",
    ]
    assert (root / "validation" / "label-synth-validation-000000.npy").is_file()
    data.validate_dataset(cfg, root)
    stats = data.read_stats(root, 16)
    npy = data.DeepCamFiles(root / "validation", file_format="numpy", stats=stats)
    h5 = data.DeepCamFiles(small_data / "validation", file_format="hdf5", stats=stats)
    for i in range(len(h5)):
        assert torch.equal(npy[i][0], h5[i][0]) and torch.equal(npy[i][1], h5[i][1])


# ---------------------------------------------------------------- bad input
def one_line_error(cfg: DeepCamConfig, root: Path) -> str:
    with pytest.raises(DataError) as info:
        data.validate_dataset(cfg, root)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_truncated_hdf5_file_is_named(small_data: Path, tmp_path: Path) -> None:
    root = copy_dataset(small_data, tmp_path / "d")
    victim = sorted((root / "train").glob("data-*.h5"))[3]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    message = one_line_error(make_cfg(*SMALL), root)
    assert str(victim) in message and "not a readable HDF5 file" in message and "truncated" in message


def test_missing_labels_are_named(small_data: Path, tmp_path: Path) -> None:
    root = copy_dataset(small_data, tmp_path / "d")
    victim = sorted((root / "validation").glob("data-*.h5"))[1]
    with h5py.File(victim, "a") as handle:
        del handle["climate/labels_0"]
    message = one_line_error(make_cfg(*SMALL), root)
    assert message.startswith(str(victim)) and "has no climate/labels_0 dataset" in message


def test_class_id_out_of_range_is_named(small_data: Path, tmp_path: Path) -> None:
    root = copy_dataset(small_data, tmp_path / "d")
    victim = sorted((root / "train").glob("data-*.h5"))[0]
    with h5py.File(victim, "a") as handle:
        handle["climate/labels_0"][4, 9] = 7
    message = one_line_error(make_cfg(*SMALL), root)
    assert str(victim) in message and "class id 7 at pixel (4, 9) is out of range" in message


def test_stats_with_other_channel_count_is_named(small_data: Path, tmp_path: Path) -> None:
    root = copy_dataset(small_data, tmp_path / "d")
    with h5py.File(root / "stats.h5", "w") as handle:
        handle["climate/minval"] = np.zeros(12, np.float32)
        handle["climate/maxval"] = np.ones(12, np.float32)
    message = one_line_error(make_cfg(*SMALL), root)
    assert str(root / "stats.h5") in message
    assert "climate/minval has shape [12] but the data have 16 channels" in message


def test_bad_file_stops_the_cli_with_one_line(small_data: Path, tmp_path: Path, run_mlhpc) -> None:
    root = copy_dataset(small_data, tmp_path / "d")
    victim = sorted((root / "train").glob("data-*.h5"))[0]
    with h5py.File(victim, "a") as handle:
        handle["climate/labels_0"][0, 0] = -1
    # a batch the 8 samples hold (mlhpc run refuses a batch an epoch cannot fill, before reading)
    args = ["run", "deepcam", "--data", str(root), "--out", str(tmp_path / "out"), "--no-check", *SMALL]
    proc = run_mlhpc([*args, "loop.global_batch_size=8"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "class id -1 at pixel (0, 0)" in proc.stderr
