"""Devices: what the CUDA, MPS and multi-GPU paths do, shown on the CPU where a CPU can show it (by
standing in for torch.cuda / torch.mps), and on a GPU (skipped without one) where only a GPU can."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import vitzoo
from vitzoo import evaluate
from vitzoo.train import TrainConfig, checkpoint, distributed, fit, loop

TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tiny_config(tmp_path=None, **changes) -> TrainConfig:
    base = dict(model="vit_ti16", model_options=dict(TINY), data="synthetic", train_limit=128, test_limit=64,
                batch_size=32, steps=4, lr=3e-3, warmup=1, log_every=2, checkpoint_every=0, quiet=True,
                tensorboard=False, device="cpu", out=str(tmp_path / "run") if tmp_path is not None else None)
    base.update(changes)
    return TrainConfig(**base)


class Float64Made(TorchFunctionMode):
    """Records every torch call that returns a float64 tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.float64:
            self.calls.append(getattr(func, "__name__", str(func)))
        return out


# ---------------------------------------------------------------------------- MPS: no float64
def test_sums_on_mps_are_float32_and_float64_elsewhere():
    """MPS has no float64: sums kept on it are float32; on the CPU and CUDA they stay float64."""
    assert evaluate.sum_dtype(torch.device("mps")) == torch.float32
    assert evaluate.sum_dtype(torch.device("cpu")) == torch.float64
    assert evaluate.sum_dtype(torch.device("cuda", 1)) == torch.float64


def test_training_and_evaluation_make_no_float64_tensor_on_a_device_without_float64(monkeypatch):
    """With sums in float32 (as on MPS), a run (loss and clock reductions, gradient norm, evaluation)
    makes no float64 tensor at all: none would reach the device."""
    monkeypatch.setattr(loop, "sum_dtype", lambda device: torch.float32)
    monkeypatch.setattr(evaluate, "sum_dtype", lambda device: torch.float32)
    with Float64Made() as seen:
        summary = fit(tiny_config(eval_every=2))
    assert seen.calls == []
    assert summary["status"] == "finished" and summary["test_top1"] is not None


def test_the_mps_random_state_is_checkpointed_and_restored(monkeypatch):
    """On MPS the checkpoint holds the MPS generator's state, and resuming restores it."""
    saved = torch.arange(8, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda *a, **k: saved.clone())
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda state, *a, **k: restored.append(state))
    state = checkpoint.rng_state(torch.device("mps"))
    assert torch.equal(state["mps"], saved) and "cuda" not in state
    checkpoint.set_rng_state(state, torch.device("mps"))
    assert len(restored) == 1 and torch.equal(restored[0], saved)


# ---------------------------------------------------------------------------- CUDA random state: the rank's own GPU
class FakeCudaRng:
    """Stands in for torch.cuda's per-device generators: records which device is read and written."""

    def __init__(self, monkeypatch) -> None:
        self.read, self.written = [], []
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("every GPU's state was read"))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: pytest.fail("every GPU's state was written"))

    def get(self, device="cuda"):
        self.read.append(torch.device(device))
        return torch.full((4,), torch.device(device).index or 0, dtype=torch.uint8)

    def set(self, state, device="cuda"):
        self.written.append((torch.device(device), state.clone()))


def test_a_rank_saves_and_restores_only_its_own_gpus_random_state(monkeypatch):
    """The rank on cuda:1 saves cuda:1's state alone, and restores it onto cuda:1."""
    fake = FakeCudaRng(monkeypatch)
    state = checkpoint.rng_state(torch.device("cuda", 1))
    assert fake.read == [torch.device("cuda", 1)]
    checkpoint.set_rng_state(state, torch.device("cuda", 1))
    assert [(d, s.tolist()) for d, s in fake.written] == [(torch.device("cuda", 1), [1, 1, 1, 1])]


def test_resume_from_an_old_checkpoint_on_a_machine_with_fewer_gpus_does_not_crash(monkeypatch):
    """Old checkpoints hold every visible GPU's state; a rank whose GPU is not among them keeps its
    fresh state, one whose GPU is restores that GPU's entry."""
    fake = FakeCudaRng(monkeypatch)
    old = {**checkpoint.rng_state(), "cuda": [torch.zeros(4, dtype=torch.uint8), torch.ones(4, dtype=torch.uint8)]}
    checkpoint.set_rng_state(old, torch.device("cuda", 3))
    assert fake.written == []
    checkpoint.set_rng_state(old, torch.device("cuda", 1))
    assert [(d, s.tolist()) for d, s in fake.written] == [(torch.device("cuda", 1), [1, 1, 1, 1])]


def test_a_cpu_resume_of_a_gpu_checkpoint_ignores_the_gpu_state(monkeypatch):
    """A checkpoint written on CUDA resumes on the CPU: the CUDA state is not touched."""
    fake = FakeCudaRng(monkeypatch)
    state = checkpoint.rng_state(torch.device("cuda", 0))
    checkpoint.set_rng_state(state, torch.device("cpu"))
    assert fake.written == []


# ---------------------------------------------------------------------------- one process per GPU
def test_more_processes_than_gpus_is_an_error_at_start_naming_the_counts(monkeypatch):
    """Local rank 2 on a node with 2 GPUs fails at once, saying how many GPUs and what to start."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert distributed.pick_device("cuda", 1) == torch.device("cuda", 1)
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK 2 .* 2 visible CUDA device.*--nproc_per_node 2"):
        distributed.pick_device("cuda", 2)
    with pytest.raises(RuntimeError, match="LOCAL_RANK 2"):
        distributed.pick_device("auto", 2)


# ---------------------------------------------------------------------------- precision=auto
@pytest.mark.parametrize(("native", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_auto_precision_is_bf16_only_on_gpus_that_have_it_natively(monkeypatch, native, expected):
    """precision=auto: bf16 where the GPU computes it natively (A100, H100), fp16 with the loss scaler
    where it only emulates it (T4, V100); float32 on the CPU."""
    monkeypatch.setattr(loop, "native_bf16", lambda device: native)
    assert loop.resolve_precision(tiny_config(precision="auto"), torch.device("cuda", 0)) == expected
    assert loop.resolve_precision(tiny_config(precision="auto"), torch.device("cpu")) is None


@CUDA
def test_native_bf16_asks_about_the_training_gpu_without_emulation():
    """The answer is torch's for the given GPU, emulation not counted."""
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    with torch.cuda.device(device):
        assert loop.native_bf16(device) == torch.cuda.is_bf16_supported(including_emulation=False)


@CUDA
def test_cuda_random_state_survives_a_save_and_restore():
    """Restoring the saved state of the training GPU replays its random numbers."""
    device = torch.device("cuda", 0)
    state = checkpoint.rng_state(device)
    first = torch.rand(8, device=device)
    checkpoint.set_rng_state(state, device)
    assert torch.equal(torch.rand(8, device=device), first)


# ---------------------------------------------------------------------------- the paper scale fits on GPUs
def test_the_paper_scale_accumulates_micro_batches_and_decodes_in_workers():
    """The paper's batch of 4096 is accumulated from micro-batches a GPU holds (one forward pass of 4096
    ViT-B/16 images would not fit), and JPEGs are decoded by loader workers."""
    from benchmarks.scales import SCALES

    train = TrainConfig(model="vit_b16", data="synthetic", **SCALES["paper"].train).resolved()
    assert train.batch_size == 4096
    assert train.micro_batch is not None and train.micro_batch <= 128 and train.batch_size % train.micro_batch == 0
    assert train.num_workers > 0


# ---------------------------------------------------------------------------- inspection and cost on the model's device
def test_attention_distance_is_computed_where_the_attention_maps_are():
    """A model on another device than the CPU (here `meta`, standing in for a GPU) gives its mean
    attention distance on that device, not a device-mismatch error."""
    from vitzoo.inspect import mean_attention_distance

    model = vitzoo.create("vit_ti16", embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=32, patch_size=8, device="meta")
    distance = mean_attention_distance(model, torch.randn(1, 3, 32, 32, device="meta"))
    assert distance.device.type == "meta" and distance.shape == (1, 2)


class RunsOutOfMemoryAbove(torch.nn.Module):
    """A model that fits batches up to `most` images."""

    def __init__(self, most: int | None) -> None:
        super().__init__()
        self.most = most
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        if self.most is not None and x.shape[0] > self.most:
            raise torch.OutOfMemoryError("out of memory")
        return x.mean() * self.weight


def test_the_largest_batch_is_found_by_bisection_and_a_batch_at_the_cap_is_reported_as_at_least():
    """The search finds the largest batch that fits; a model that fits every batch up to the cap is
    reported as "at least" the cap, not as if the cap were measured."""
    from benchmarks import cost

    assert cost.largest_cuda_batch(RunsOutOfMemoryAbove(40), size=4) == 40
    capped = cost.largest_cuda_batch(RunsOutOfMemoryAbove(None), size=4)
    assert capped == cost.BATCH_CAP == 4096
    assert cost.largest_batch({"largest_batch": capped, "batch_cap": cost.BATCH_CAP}) == "at least 4096"
    assert cost.largest_batch({"largest_batch": 40, "batch_cap": cost.BATCH_CAP}) == 40


def test_cost_resolves_auto_to_a_real_device_and_records_it(monkeypatch):
    """`--device auto` measures on the device `auto` stands for (here the CPU), and says which."""
    from benchmarks import cost
    from benchmarks.spec import Scale
    from benchmarks.suite import Run

    monkeypatch.setattr(cost, "cpu_largest_batch", lambda name, size, batch: {"largest_batch": 1})
    cell = cost.cells(Scale("quick", {}, {}, seeds=1))[0]
    run = Run("cost", cell.label, {"model": cell.model, "options": cell.options, "train": cell.train})
    result = cost.measure(run, "auto")
    assert result["metrics"]["measured_on"] == "cpu"


def test_cost_synchronises_the_models_gpu_not_the_current_one(monkeypatch):
    """Timing a model on cuda:1 waits for cuda:1's queue."""
    from benchmarks import cost

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(torch.device(device)))
    cost.synchronize(torch.device("cuda", 1))
    cost.synchronize(torch.device("cpu"))
    assert waited == [torch.device("cuda", 1)]
