"""Devices: what the CUDA, MPS and multi-GPU paths do, shown on the CPU where a CPU can show it (by
standing in for torch.cuda / torch.mps), and on a GPU (skipped without one) where only a GPU can."""

import json
import multiprocessing

import pytest
import torch
from torch.overrides import TorchFunctionMode
from train_testing import TINY, lines, tiny_config

import vitzoo
from vitzoo import evaluate, precision
from vitzoo.train import checkpoint, distributed, fit, inputs, loop

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def fake_gpus(monkeypatch, count: int) -> None:
    for name, value in dict(is_available=lambda: True, device_count=lambda: count,
                            get_device_name=lambda device=None: "Some GPU").items():
        monkeypatch.setattr(torch.cuda, name, value)


class Calls(TorchFunctionMode):
    """The torch calls that returned a float64 tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.float64 = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.float64:
            self.float64.append(getattr(func, "__name__", ""))
        return out


def test_a_run_with_sums_in_float32_makes_no_float64_tensor(monkeypatch):
    """MPS has no float64: with the sums it keeps in float32, a run (loss and clock reductions,
    gradient norm, evaluation) makes no float64 tensor that would reach the device."""
    assert precision.sum_dtype(torch.device("mps")) == torch.float32
    assert precision.sum_dtype(torch.device("cuda", 1)) == torch.float64
    a = torch.randn(4, 4)  # one autocast: its dtype, or float32 even inside another autocast
    with torch.autocast("cpu", dtype=torch.bfloat16), precision.autocast("cpu", None):
        assert (a @ a).dtype == torch.float32
    monkeypatch.setattr(loop, "sum_dtype", lambda device: torch.float32)
    monkeypatch.setattr(evaluate, "sum_dtype", lambda device: torch.float32)
    with Calls() as seen:
        assert fit(tiny_config(eval_every=2, steps=4))["test_top1"] is not None
    assert seen.float64 == []


def test_a_checkpoint_holds_this_devices_random_state_and_restores_it(monkeypatch):
    """The MPS generator's state, or on CUDA this rank's GPU's alone (not every GPU's, so that
    another number of GPUs resumes); a GPU's state is left alone on a CPU."""
    mps, cuda, written = torch.arange(8, dtype=torch.uint8), [], []
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda *a: mps.clone())
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda state, *a: written.append(("mps",
                                                                                     state)))
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: cuda.append(device) or
                        torch.full((4,), device.index, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: written.append(
        (device, state)))
    for name in ("get_rng_state_all", "set_rng_state_all"):
        monkeypatch.setattr(torch.cuda, name, lambda *a: pytest.fail("every GPU's state"))
    on_mps, on_gpu = (checkpoint.rng_state(torch.device(d)) for d in ("mps", "cuda:1"))
    assert torch.equal(on_mps["mps"], mps) and "cuda" not in on_mps and cuda == [
        torch.device("cuda", 1)]
    checkpoint.set_rng_state(on_gpu, torch.device("cpu"))
    assert written == []
    checkpoint.set_rng_state(on_mps, torch.device("mps"))
    checkpoint.set_rng_state(on_gpu, torch.device("cuda", 1))
    assert [(d, s.tolist()) for d, s in written] == [("mps", list(range(8))),
                                                    (torch.device("cuda", 1), [1] * 4)]


def test_each_rank_takes_its_own_gpu_and_a_named_gpu_is_that_gpu(monkeypatch):
    fake_gpus(monkeypatch, 2)
    assert distributed.pick_device("cuda", 1) == distributed.pick_device("cuda:1") == torch.device(
        "cuda", 1) == distributed.pick_device("auto", 1)
    fake_gpus(monkeypatch, 1)  # SLURM's --gpu-bind: each task sees its own GPU as device 0
    assert distributed.pick_device("cuda", 5) == torch.device("cuda", 0)


def test_the_training_loader_lives_through_the_run_and_each_evaluation_ends_its_workers(
        monkeypatch):
    """With a worker: one training loader, its worker kept between epochs and evaluations; each
    evaluation pass's workers end with it."""
    alive, made = [], []
    real_loader, real_final = inputs.DataLoader, loop.Trainer.final_evaluation
    monkeypatch.setattr(inputs, "DataLoader", lambda *a, **k: made.append(k.get(
        "persistent_workers")) or real_loader(*a, **k))
    real_during = loop.Trainer.evaluate_during_training
    for name, real in (("evaluate_during_training", real_during), ("final_evaluation", real_final)):
        monkeypatch.setattr(loop.Trainer, name, lambda self, real=real: (
            real(self), alive.append(len(multiprocessing.active_children()) - before))[0])
    before = len(multiprocessing.active_children())
    assert fit(tiny_config(steps=12, eval_every=4, num_workers=1, val_size=32))["val_top1"]
    assert made == [True] and alive == [1, 1, 1]


def test_every_rank_checks_the_run_directory_before_rank_0_writes_to_it(tmp_path, monkeypatch):
    seen, real = [], distributed.barrier
    monkeypatch.setattr(distributed, "barrier", lambda env: (seen.append(sorted(
        p.name for p in (tmp_path / "run").glob("*"))), real(env)))
    fit(tiny_config(tmp_path, steps=2, warmup=1))
    assert seen[0] == [] and "summary.json" in seen[-1]  # the last after rank 0's last write


# ---------------------------------------------------------------------------- on a GPU only
@CUDA
def test_on_cuda_fp16_bf16_and_workers_train_and_a_resume_is_exact(tmp_path):
    """fp16 with the loss scaler (its state checkpointed), bf16 with an evaluation, loader
    workers with pinned memory, and a resume that restores the GPU's generator (dropout)."""
    fp16 = fit(tiny_config(tmp_path / "fp16", device="cuda", precision="fp16", checkpoint_every=2))
    state = torch.load(tmp_path / "fp16/run/checkpoints/step_00000008/state.pt")
    assert fp16["precision"] == "float16" and state["scaler"]["scale"] > 0
    bf16 = fit(tiny_config(device="cuda", precision="bf16", eval_every=2))
    assert bf16["precision"] == "bfloat16"
    changes = dict(device="cuda", precision="fp32", model_options=dict(dropout=0.1, drop_path=0.1))
    fit(tiny_config(tmp_path / "straight", num_workers=2, **changes))
    fit(tiny_config(tmp_path / "split", stop_at=3, **changes))
    fit(tiny_config(tmp_path / "split", resume=True, **changes))
    straight, split = ([r["loss"] for r in lines(tmp_path / n / "run") if "loss" in r]
                       for n in ("straight", "split"))
    assert all(abs(a - b) <= 1e-5 for a, b in zip(straight, split)) and len(split) == 8


@CUDA
def test_auto_takes_this_gpu_and_its_random_state_is_restored():
    assert distributed.pick_device("auto") == torch.device("cuda", 0)
    assert precision.native_bf16(torch.device("cuda", 0)) == torch.cuda.is_bf16_supported(
        including_emulation=False)
    rngs = checkpoint.rng_state(torch.device("cuda", 0))
    first = torch.rand(8, device="cuda")
    checkpoint.set_rng_state(rngs, torch.device("cuda", 0))
    assert torch.equal(torch.rand(8, device="cuda"), first)


@CUDA
def test_saving_a_checkpoint_allocates_almost_nothing_on_the_gpu(tmp_path):
    model = vitzoo.create("vit_s16", num_classes=10).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, 224, 224, device="cuda")).sum().backward()
    optimizer.step()
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    checkpoint.save(tmp_path, 1, model, {"optimizer": optimizer.state_dict()})
    checkpoint.host_copy(model)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < size / 4
    assert json.loads((tmp_path / "step_00000001" / "config.json").read_text())


# ---------------------------------------------------------------------------- the benchmarks
def test_the_paper_scale_accumulates_micro_batches_and_decodes_in_workers():
    from benchmarks.scales import SCALES

    from vitzoo.train import TrainConfig

    train = TrainConfig(model="vit_b16", data="synthetic", **SCALES["paper"].train).resolved()
    assert train.batch_size == 4096 and train.micro_batch <= 128 and train.num_workers > 0
    assert train.batch_size % train.micro_batch == 0


def test_the_cost_ablation_measures_on_the_models_device(monkeypatch):
    """The largest batch is bisected (a batch at the cap is "at least"); a CPU's memory growth
    under the noise bounds it from below; `auto` is recorded as the device it stands for; a
    model on cuda:1 waits for cuda:1's queue; attention distances stay on the model's device."""
    from benchmarks import speed
    from benchmarks.ablations import cost
    from benchmarks.spec import Scale
    from benchmarks.suite import Run

    from vitzoo.analysis import mean_attention_distance

    class FitsUpTo(torch.nn.Module):
        def __init__(self, most):
            super().__init__()
            self.most, self.weight = most, torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            if self.most is not None and x.shape[0] > self.most:
                raise torch.OutOfMemoryError("out of memory")
            return x.mean() * self.weight

    assert cost.largest_cuda_batch(FitsUpTo(40), size=4) == 40
    assert cost.largest_batch({"largest_batch": cost.largest_cuda_batch(FitsUpTo(None), size=4),
                               "batch_cap": cost.BATCH_CAP}) == "at least 4096"
    noise = cost.extrapolated((2, {"weights_gb": 0.3, "peak_gb": 0.1}),
                              (8, {"weights_gb": 0.3, "peak_gb": 0.100006}), budget_gb=16.0)
    assert not noise["resolved"] and noise["largest_batch"] < 10_000
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cost, "cpu_largest_batch", lambda name, options, batch: {})
    cell = cost.cells(Scale("quick", {}, {}, seeds=1))[0]
    run = Run("cost", cell.label, dict(model=cell.model, options=cell.options, train=cell.train))
    assert cost.measure(run, "auto")["metrics"]["measured_on"] == "cpu"
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    speed.synchronize(torch.device("cuda", 1))  # cost times as benchmarks.speed does
    speed.synchronize(torch.device("cpu"))
    assert waited == [torch.device("cuda", 1)]
    model = vitzoo.create("vit_ti16", **{**TINY, "depth": 1, "img_size": 32, "patch_size": 8},
                          device="meta")
    distance = mean_attention_distance(model, torch.randn(1, 3, 32, 32, device="meta"))
    assert distance.device.type == "meta" and distance.shape == (1, 2)


def test_a_record_names_the_gpu_it_was_measured_on(monkeypatch):
    from benchmarks import suite

    asked = []
    fake_gpus(monkeypatch, 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device)
                        or "Some GPU 80GB")
    assert suite.environment("cuda:1")["gpu"] == "Some GPU 80GB"
    assert asked == [torch.device("cuda", 1)] and "gpu" not in suite.environment("cpu")


@CUDA
def test_the_gpu_matmul_ceiling_is_below_any_gpus_peak():
    from benchmarks import speed as timing

    shapes = [(8 * 197, 768, 3072), (8 * 197, 3072, 768)]  # ViT-B/16's MLP at batch 8
    for dtype in (None, torch.bfloat16):
        assert 0 < timing.matmul_ceiling(shapes, dtype, reps=3, device=torch.device("cuda")) < 2e6
