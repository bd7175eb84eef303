"""Devices: what the CUDA, MPS and multi-GPU paths do, shown on the CPU where a CPU can show it (by
standing in for torch.cuda / torch.mps), and on a GPU (skipped without one) where only a GPU can."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from train_testing import TINY

import vitzoo
from vitzoo import evaluate, precision
from vitzoo.train import TrainConfig, build, checkpoint, distributed, fit, loop

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tiny_config(tmp_path=None, **changes) -> TrainConfig:
    base = dict(model="vit_ti16", model_options=dict(TINY), data="synthetic", train_limit=128, test_limit=64,
                batch_size=32, steps=4, lr=3e-3, warmup=1, log_every=2, checkpoint_every=0, quiet=True,
                tensorboard=False, device="cpu", out=str(tmp_path / "run") if tmp_path is not None else None)
    base.update(changes)
    return TrainConfig(**base)


def fake_gpus(monkeypatch, count: int, capability=(9, 0), arches=("sm_80", "sm_90")) -> None:
    """torch.cuda as on a machine with `count` GPUs of `capability`, torch built for `arches`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arches))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")


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
    assert precision.sum_dtype(torch.device("mps")) == torch.float32
    assert precision.sum_dtype(torch.device("cpu")) == torch.float64
    assert precision.sum_dtype(torch.device("cuda", 1)) == torch.float64


def test_autocast_computes_in_its_dtype_and_in_float32_without_one():
    """One autocast for training, evaluation, compilation and the benchmarks: a dtype computes in it;
    None computes in float32, even inside another autocast."""
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with precision.autocast(torch.device("cpu"), torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16), precision.autocast("cpu", None):
        assert (a @ b).dtype == torch.float32


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
    rngs = checkpoint.rng_state(torch.device("mps"))
    assert torch.equal(rngs["mps"], saved) and "cuda" not in rngs
    checkpoint.set_rng_state(rngs, torch.device("mps"))
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
    rngs = checkpoint.rng_state(torch.device("cuda", 1))
    assert fake.read == [torch.device("cuda", 1)]
    checkpoint.set_rng_state(rngs, torch.device("cuda", 1))
    assert [(d, s.tolist()) for d, s in fake.written] == [(torch.device("cuda", 1), [1, 1, 1, 1])]


def test_a_cpu_resume_of_a_gpu_checkpoint_ignores_the_gpu_state(monkeypatch):
    """A checkpoint written on CUDA resumes on the CPU: the CUDA state is not touched."""
    fake = FakeCudaRng(monkeypatch)
    rngs = checkpoint.rng_state(torch.device("cuda", 0))
    checkpoint.set_rng_state(rngs, torch.device("cpu"))
    assert fake.written == []


# ---------------------------------------------------------------------------- one process per GPU
def test_more_processes_than_gpus_is_an_error_at_start_naming_the_counts(monkeypatch):
    """Local rank 2 on a node with 2 GPUs fails at once, saying how many GPUs and what to start."""
    fake_gpus(monkeypatch, 2)
    assert distributed.pick_device("cuda", 1) == torch.device("cuda", 1)
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK 2 .* 2 visible CUDA device.*--nproc_per_node 2"):
        distributed.pick_device("cuda", 2)
    with pytest.raises(RuntimeError, match="LOCAL_RANK 2"):
        distributed.pick_device("auto", 2)


# ---------------------------------------------------------------------------- precision=auto
@pytest.mark.parametrize(("native", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_auto_precision_is_bf16_only_on_gpus_that_have_it_natively(monkeypatch, native, expected):
    """precision=auto: bf16 where the GPU computes it natively (A100, H100), fp16 with the loss scaler
    where it only emulates it (T4, V100), as gpu-half is; both are float32 on the CPU."""
    monkeypatch.setattr(precision, "native_bf16", lambda device: native)
    for rule in ("auto", "gpu-half"):
        assert precision.training_dtype(rule, torch.device("cuda", 0)) == expected
        assert precision.training_dtype(rule, torch.device("cpu")) is None


@CUDA
def test_native_bf16_asks_about_the_training_gpu_without_emulation():
    """The answer is torch's for the given GPU, emulation not counted."""
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    with torch.cuda.device(device):
        assert precision.native_bf16(device) == torch.cuda.is_bf16_supported(including_emulation=False)


@CUDA
def test_cuda_random_state_survives_a_save_and_restore():
    """Restoring the saved state of the training GPU replays its random numbers."""
    device = torch.device("cuda", 0)
    rngs = checkpoint.rng_state(device)
    first = torch.rand(8, device=device)
    checkpoint.set_rng_state(rngs, device)
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
    from vitzoo.analysis import mean_attention_distance

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
    from benchmarks.ablations import cost

    assert cost.largest_cuda_batch(RunsOutOfMemoryAbove(40), size=4) == 40
    capped = cost.largest_cuda_batch(RunsOutOfMemoryAbove(None), size=4)
    assert capped == cost.BATCH_CAP == 4096
    assert cost.largest_batch({"largest_batch": capped, "batch_cap": cost.BATCH_CAP}) == "at least 4096"
    assert cost.largest_batch({"largest_batch": 40, "batch_cap": cost.BATCH_CAP}) == 40


def test_a_cpu_memory_growth_under_the_noise_gives_a_lower_bound_not_a_huge_batch():
    """On the CPU the largest batch is extrapolated from the peak memory at two batches. A growth the
    noise can hide (measured once: 6 KB between batches 2 and 8, extrapolated to 15.6 million images)
    bounds the batch from below; a clear growth is extrapolated."""
    from benchmarks.ablations import cost

    def point(batch, peak_gb):
        return batch, {"weights_gb": 0.3, "peak_gb": peak_gb}

    unresolved = cost.extrapolated(point(2, 0.100), point(8, 0.100006), budget_gb=16.0)
    per_image = cost.MEMORY_RESOLUTION_GB / 6  # at most the resolution over the 6 images between the batches
    bound = int((16.0 - 0.3 - max(0.100006 - per_image * 8, 0.0)) // per_image)
    assert not unresolved["resolved"] and unresolved["largest_batch"] == bound < 10_000
    assert cost.largest_batch(unresolved) == f"at least {bound}"
    resolved = cost.extrapolated(point(2, 0.1), point(8, 0.1 + 6 * 0.05), budget_gb=16.0)  # 50 MB per image
    assert resolved["resolved"] and resolved["largest_batch"] == int((16.0 - 0.3 - 0.1 + 0.1) // 0.05)
    assert cost.largest_batch(resolved) == resolved["largest_batch"]


def test_cost_resolves_auto_to_a_real_device_and_records_it(monkeypatch):
    """`--device auto` measures on the device `auto` stands for (the CPU, on a machine without a GPU),
    and says which."""
    from benchmarks.ablations import cost
    from benchmarks.spec import Scale
    from benchmarks.suite import Run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cost, "cpu_largest_batch", lambda name, options, batch: {"largest_batch": 1})
    cell = cost.cells(Scale("quick", {}, {}, seeds=1))[0]
    run = Run("cost", cell.label, {"model": cell.model, "options": cell.options, "train": cell.train})
    result = cost.measure(run, "auto")
    assert result["metrics"]["measured_on"] == "cpu"


def test_cost_synchronises_the_models_gpu_not_the_current_one(monkeypatch):
    """Timing a model on cuda:1 waits for cuda:1's queue."""
    from benchmarks.ablations import cost

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(torch.device(device)))
    cost.synchronize(torch.device("cuda", 1))
    cost.synchronize(torch.device("cpu"))
    assert waited == [torch.device("cuda", 1)]


# ---------------------------------------------------------------------------- no host-device sync per step
class HostReads(TorchFunctionMode):
    """Counts the reads of a tensor's values into Python (each makes the host wait for the device)."""

    READS = {"item", "tolist", "__float__", "__int__", "__bool__"}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_per_step_values_stay_on_the_device_until_log_time(monkeypatch):
    """8 steps logged every 4 read the device's numbers at the 2 log points (and the sampler's order
    once an epoch), not several times a step; what is logged is every step's value all the same."""
    reads = HostReads()
    counted = {}

    class LoopStarts(loop.Metrics):  # made just before the first step
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            counted["before"] = reads.count

    def first_evaluation(*args, **kwargs):  # the training loop ends where the final evaluation starts
        counted.setdefault("training", reads.count - counted["before"])
        return real(*args, **kwargs)

    real = build.classification_sums
    monkeypatch.setattr(loop, "Metrics", LoopStarts)
    monkeypatch.setattr(build, "classification_sums", first_evaluation)
    with reads:
        summary = fit(tiny_config(steps=8, log_every=4))
    # 2 log points; in each of the 2 epochs, the sampler's order and the loader's seed (host tensors)
    assert counted["training"] <= 2 + 2 * 2
    assert summary["status"] == "finished" and summary["final_loss"] is not None


def test_a_non_finite_loss_between_log_points_is_caught_at_the_next_read_and_named_by_its_step(monkeypatch):
    """The loss is read at log time, yet a NaN in the sixth step is reported as step 6's (as the metrics
    number steps), not as the log point's (8)."""
    calls = {"n": 0}
    real = loop.loss_fn

    def poisoned(logits, targets, smoothing):
        calls["n"] += 1
        return real(logits, targets, smoothing) * (float("nan") if calls["n"] == 6 else 1.0)

    monkeypatch.setattr(loop, "loss_fn", poisoned)
    with pytest.raises(loop.TrainingDiverged, match=r"loss is nan at step 6"):
        fit(tiny_config(steps=8, log_every=4))


def test_normalising_a_batch_makes_no_tensor_from_host_data():
    """The normalisation's mean and std are made once; a batch then needs no copy from the host."""
    from vitzoo import data

    made = []

    class TensorsMade(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.tensor:
                made.append(args)
            return func(*args, **(kwargs or {}))

    normalizer = data.Normalizer((0.5, 0.4, 0.3), (0.2, 0.2, 0.2), 3, "cpu")
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    with TensorsMade():
        out = normalizer(images)
    assert made == []
    assert torch.equal(out, data.normalize(images, (0.5, 0.4, 0.3), (0.2, 0.2, 0.2), 3))


# ---------------------------------------------------------------------------- loaders and DDP
def test_the_training_loader_is_made_once_with_persistent_workers_and_evaluation_loaders_without(monkeypatch):
    """Over three epochs with evaluations, one training loader is made, its workers persisting between
    epochs and evaluations; each evaluation (steps 4 and 8, and the final one) makes a loader whose
    workers end with it."""

    made = []
    real_loader, real_eval_loader = build.DataLoader, build.eval_loader

    def training_loader(*args, **kwargs):
        made.append(("train", kwargs.get("persistent_workers")))
        return real_loader(*args, **kwargs)

    def evaluation_loader(*args, **kwargs):
        loader = real_eval_loader(*args, **kwargs)
        made.append(("eval", loader.persistent_workers))
        return loader

    monkeypatch.setattr(build, "DataLoader", training_loader)
    monkeypatch.setattr(build, "eval_loader", evaluation_loader)
    summary = fit(tiny_config(steps=12, eval_every=4, num_workers=1))
    assert summary["status"] == "finished"
    assert made == [("train", True), ("eval", False), ("eval", False), ("eval", False)]


def test_a_rank_keeps_only_the_training_loaders_workers_alive_between_evaluations(monkeypatch):
    """With 1 worker, the loader workers alive after each evaluation (validation at steps 4 and 8, then
    validation and test at the end) are the training loader's one."""
    import multiprocessing

    alive = []
    during, final = loop.Trainer.evaluate_during_training, loop.Trainer.final_evaluation

    def counted(method):
        def count(self):
            result = method(self)
            alive.append(len(multiprocessing.active_children()) - before)
            return result
        return count

    monkeypatch.setattr(loop.Trainer, "evaluate_during_training", counted(during))
    monkeypatch.setattr(loop.Trainer, "final_evaluation", counted(final))
    before = len(multiprocessing.active_children())
    summary = fit(tiny_config(steps=12, eval_every=4, num_workers=1, val_size=32))
    assert summary["status"] == "finished" and summary["val_top1"] is not None
    assert alive == [1, 1, 1]


def test_ddp_broadcasts_buffers_only_for_running_statistics():
    """vitzoo's only buffer is the relative position index, constant: DDP need not broadcast it every
    forward pass. A model with BatchNorm running statistics (a plugin's stem, say) does need it."""
    relative = vitzoo.create("vit_ti16", **{**TINY, "pos_embed": "relative"})
    assert {name.rsplit(".", 1)[-1] for name, _ in relative.named_buffers()} == {"index"}
    assert not build.has_running_statistics(relative)
    assert build.has_running_statistics(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)))


# ---------------------------------------------------------------------------- the few-shot evaluation, sharded
def _gather_in_group(rank: int, world: int, store_path: str, results) -> None:
    store = torch.distributed.FileStore(store_path, world)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world)
    env = distributed.Env(rank, world, rank, torch.device("cpu"))
    total = 7
    mine = torch.arange(total, dtype=torch.float32)[rank::world].unsqueeze(1) * 10
    results[rank] = distributed.gather_strided(mine, total, env).flatten().tolist()
    torch.distributed.destroy_process_group()


def test_features_shared_between_processes_are_gathered_in_order(tmp_path):
    """Rank r extracts rows r, r + W, ...; every rank gets all rows back in their order (shares of
    unequal size included: 7 rows over 2 ranks)."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_gather_in_group, args=(2, str(tmp_path / "store"), results), nprocs=2, join=True)
        gathered = dict(results)
    expected = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert gathered == {0: expected, 1: expected}


def test_the_end_of_run_few_shot_evaluation_uses_the_loops_sharded_features(monkeypatch):
    """Few-shot features come from the loop's sharing extractor with the configured workers; in one
    process that gives what the plain evaluation gives."""
    seen = {}
    real = build.fewshot_linear_accuracy

    def capture(model, train_set, test_set, shots, **kwargs):
        seen["features"] = kwargs.get("features")
        seen["plain"] = real(model, train_set, test_set, shots, draws=kwargs["draws"], seed=kwargs["seed"])
        return real(model, train_set, test_set, shots, **kwargs)

    monkeypatch.setattr(build, "fewshot_linear_accuracy", capture)
    summary = fit(tiny_config(fewshot=(1, 2)))
    assert seen["features"] is not None
    assert summary["fewshot"] == {str(k): v for k, v in seen["plain"].items()}


# ---------------------------------------------------------------------------- shared files, in order
def test_every_rank_checks_the_run_directory_before_rank_0_writes_to_it(tmp_path, monkeypatch):
    """The first barrier comes after the run directory is checked and before anything is written to
    it, so a slower rank never finds the run rank 0 has just begun and calls it an existing one."""
    seen = []
    real = distributed.barrier
    monkeypatch.setattr(distributed, "barrier", lambda env: (seen.append(sorted(p.name for p in (tmp_path / "run").glob("*"))),
                                                             real(env)))
    fit(tiny_config(tmp_path))
    assert seen[0] == []
    assert "summary.json" in seen[-1]  # and the last after rank 0's last write


# ---------------------------------------------------------------------------- on a GPU only
@CUDA
def test_fp16_on_cuda_trains_with_the_loss_scaler(tmp_path):
    """fp16 autocast with GradScaler: the run finishes with a finite loss and the scaler's state is
    checkpointed."""
    summary = fit(tiny_config(tmp_path, device="cuda", precision="fp16", checkpoint_every=2))
    assert summary["status"] == "finished" and summary["precision"] == "float16"
    assert summary["final_loss"] is not None and summary["final_loss"] == summary["final_loss"]
    saved = torch.load(checkpoint.latest(tmp_path / "run" / "checkpoints") / checkpoint.STATE_NAME, weights_only=True)
    assert saved["scaler"]["scale"] > 0


@CUDA
def test_bf16_on_cuda_trains_and_evaluates():
    """bf16 autocast on the GPU (native or emulated): the run finishes and evaluates."""
    summary = fit(tiny_config(device="cuda", precision="bf16", eval_every=2))
    assert summary["status"] == "finished" and summary["precision"] == "bfloat16"
    assert 0.0 <= summary["test_top1"] <= 1.0


@CUDA
def test_resume_on_cuda_gives_the_same_losses(tmp_path):
    """Dropout and stochastic depth draw from the GPU's generator: a resumed run restores its state
    and follows the uninterrupted run."""
    changes = dict(device="cuda", precision="fp32", model_options={**TINY, "dropout": 0.1, "drop_path": 0.1},
                   steps=6, log_every=1)
    fit(tiny_config(tmp_path / "straight", **changes))
    fit(tiny_config(tmp_path / "split", stop_at=3, **changes))
    fit(tiny_config(tmp_path / "split", resume=True, **changes))

    def losses(run):
        import json

        return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]

    straight, split = losses(tmp_path / "straight" / "run"), losses(tmp_path / "split" / "run")
    assert len(straight) == len(split) == 6
    assert all(abs(a - b) <= 1e-5 for a, b in zip(straight, split)), (straight, split)


@CUDA
def test_the_pinned_memory_path_with_workers_gives_the_losses_of_the_plain_one(tmp_path):
    """Loader workers with pinned memory and non_blocking copies feed the GPU the same batches."""
    plain = fit(tiny_config(tmp_path / "plain", device="cuda", precision="fp32", num_workers=0))
    pinned = fit(tiny_config(tmp_path / "pinned", device="cuda", precision="fp32", num_workers=2, eval_every=2))
    assert abs(plain["final_loss"] - pinned["final_loss"]) <= 1e-5


# ---------------------------------------------------------------------------- the speed benchmark on GPUs
def test_results_measured_on_a_gpu_record_its_name(monkeypatch):
    """A record says which GPU (`cuda` alone does not), for cuda:1 that GPU's; CPU records have no GPU."""
    from benchmarks import machine

    asked = []
    fake_gpus(monkeypatch, 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device) or "Some GPU 80GB")
    assert machine.environment("cuda:1")["gpu"] == "Some GPU 80GB" and asked == [torch.device("cuda", 1)]
    assert "gpu" not in machine.environment("cpu")


@CUDA
def test_the_gpu_matmul_ceiling_times_many_products_with_events():
    """The ceiling on a GPU is positive and finite, and below any GPU's peak (2 PFLOP/s)."""
    from benchmarks import speed as timing

    shapes = [(8 * 197, 768, 3072), (8 * 197, 3072, 768)]  # ViT-B/16's MLP at batch 8
    for dtype in (None, torch.bfloat16):
        ceiling = timing.matmul_ceiling(shapes, dtype, reps=3, device=torch.device("cuda", 0))
        assert 0 < ceiling < 2e6


def test_a_named_gpu_is_that_gpu(monkeypatch):
    """`cuda:1` (benchmarks' --device) is GPU 1, not the local rank's; a GPU that is not there is an error."""
    fake_gpus(monkeypatch, 2)
    assert distributed.pick_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(RuntimeError, match="2 visible CUDA device"):
        distributed.pick_device("cuda:2")


# ---------------------------------------------------------------------------- a GPU this torch cannot use
@pytest.fixture
def driver_probes(tmp_path, monkeypatch):
    """The driver's GPU list and device node, in a folder the test fills; torch built for CUDA 13.0 and
    seeing no CUDA and no MPS."""
    gpus, node = tmp_path / "gpus", tmp_path / "nvidia0"
    gpus.mkdir()
    monkeypatch.setattr(distributed, "NVIDIA_PROBES", (gpus, node))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    return gpus, node


@pytest.mark.parametrize("announced", ["driver list", "device node"])
def test_auto_on_a_machine_whose_gpu_torch_cannot_use_warns_naming_the_driver(driver_probes, announced):
    """With a GPU present and CUDA unavailable (a driver older than the wheel's CUDA), `auto` still
    trains on the CPU, but says why and what to do, not silently."""
    gpus, node = driver_probes
    (gpus / "0000:01:00.0").mkdir() if announced == "driver list" else node.touch()
    with pytest.warns(UserWarning, match=r"NVIDIA GPU.*driver is older than this torch's CUDA 13\.0 needs \(driver 580 "
                                         r"or newer\).*Update the driver.*training on the CPU instead"):
        assert distributed.pick_device("auto") == torch.device("cpu")


def test_auto_without_a_gpu_settles_for_the_cpu_quietly(driver_probes, recwarn):
    assert distributed.pick_device("auto") == torch.device("cpu")
    assert len(recwarn) == 0


def test_a_cpu_build_of_torch_on_a_gpu_machine_says_so(driver_probes, monkeypatch):
    gpus, _ = driver_probes
    (gpus / "0000:01:00.0").mkdir()
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.warns(UserWarning, match="built without CUDA; install a CUDA build of torch"):
        distributed.pick_device("auto")


def test_asking_for_cuda_on_a_machine_whose_gpu_torch_cannot_use_names_the_driver(driver_probes):
    gpus, _ = driver_probes
    (gpus / "0000:01:00.0").mkdir()
    with pytest.raises(RuntimeError, match=r"--device cuda: this machine has an NVIDIA GPU.*driver"):
        distributed.pick_device("cuda")


@pytest.mark.parametrize(("capability", "arches", "runs"), [
    ((7, 0), ("sm_75", "sm_80", "sm_90"), False),  # a V100 and the CUDA 13 wheel
    ((7, 5), ("sm_75", "sm_80", "sm_90"), True),  # a T4
    ((8, 6), ("sm_80",), True),  # machine code of 8.0 runs on later minors of 8
    ((8, 0), ("sm_86",), False),  # ... not on earlier ones
    ((9, 0), ("sm_80",), False),  # ... nor on another major
    ((9, 0), ("sm_90a",), True),
    ((10, 0), ("sm_90a",), False),  # architecture-specific: that GPU alone
    ((12, 0), ("sm_80", "compute_90"), True),  # PTX is compiled for later GPUs when loaded
    ((7, 0), ("sm_75", "compute_75"), False),  # ... not for earlier ones
    ((7, 0), ("compute_70",), True),
])
def test_a_gpu_older_than_the_builds_kernels_is_an_error_at_start(monkeypatch, capability, arches, runs):
    """A GPU whose generation the build has no kernels for (nor PTX it could compile) fails at once,
    naming its compute capability, the build's architectures and what to install, for `cuda` and `auto`
    alike; every other GPU is taken."""
    fake_gpus(monkeypatch, 1, capability, arches)
    for name in ("cuda", "auto", "cuda:0"):
        if runs:
            assert distributed.pick_device(name) == torch.device("cuda", 0)
        else:
            sm = f"sm_{capability[0]}{capability[1]}"
            with pytest.raises(RuntimeError, match=rf"--device {name}: GPU 0 \(Some GPU\) has compute capability "
                                                   rf"{capability[0]}\.{capability[1]} \({sm}\).*kernels for "
                                                   rf"{arches[0]}.*includes {sm}"):
                distributed.pick_device(name)


@CUDA
def test_this_gpu_is_one_the_torch_build_has_kernels_for():
    """On the GPUs this is tested on, the check at start passes (its reading of the architecture list
    is right), `auto` picks the GPU without a warning, and the GPU computes."""
    import warnings

    assert distributed.unsupported_gpu(0) is None, torch.cuda.get_arch_list()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert distributed.pick_device("auto") == torch.device("cuda", 0)
    assert distributed.pick_device("cuda") == torch.device("cuda", 0)
    assert (torch.ones(4, device="cuda") * 2).sum().item() == 8.0


# ---------------------------------------------------------------------------- checkpoints: straight to the host
def shares_memory_with_a_parameter(tensor: torch.Tensor, model: torch.nn.Module) -> bool:
    live = {p.untyped_storage().data_ptr() for p in model.state_dict().values()}
    return tensor.untyped_storage().data_ptr() in live


def test_the_host_copy_of_the_weights_is_a_copy_that_training_does_not_change():
    """keep_best's weights and those a checkpoint writes are copies on the host, not views of the
    live parameters (on the CPU, where a `.to("cpu")` would be the parameter itself)."""
    model = vitzoo.create("vit_ti16", **TINY)
    copy = checkpoint.host_copy(model)
    assert copy.keys() == model.state_dict().keys()
    assert all(t.device.type == "cpu" and not shares_memory_with_a_parameter(t, model) for t in copy.values())
    before = copy["head.fc.weight"].clone()
    with torch.no_grad():
        model.head.fc.weight.add_(1.0)
    assert torch.equal(copy["head.fc.weight"], before)


def test_a_checkpoint_and_the_final_model_hand_the_writer_host_copies(tmp_path, monkeypatch):
    """What the safetensors writer gets, for every checkpoint and for the final model, is host copies:
    its own copy (made to unshare tensors) is then made on the host, not on the GPU."""
    from vitzoo.weights import native

    handed = []
    real = native.save_state_dict

    def record(state_dict, path, metadata=None):
        handed.append(state_dict)
        return real(state_dict, path, metadata)

    monkeypatch.setattr(native, "save_state_dict", record)
    trainer = loop.Trainer.from_config(tiny_config(tmp_path, checkpoint_every=2, keep_best=True, val_size=32, eval_every=2))
    summary = trainer.run()
    assert summary["status"] == "finished" and len(handed) == 3  # steps 2 and 4, and the final model
    for state_dict in handed:
        assert all(t.device.type == "cpu" and not shares_memory_with_a_parameter(t, trainer.model) for t in state_dict.values())
    assert not any(shares_memory_with_a_parameter(t, trainer.model) for t in trainer.best["weights"].values())
    assert vitzoo.from_pretrained(tmp_path / "run").config.embed_dim == TINY["embed_dim"]


@CUDA
def test_saving_a_checkpoint_allocates_almost_nothing_on_the_gpu(tmp_path):
    """A checkpoint of a GPU model (weights and optimizer state) and keep_best's copy of its weights
    grow the GPU's peak memory by far less than the model's size: the weights go straight to the host."""
    model = vitzoo.create("vit_s16", num_classes=10).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, 224, 224, device="cuda")).sum().backward()
    optimizer.step()
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    checkpoint.save(tmp_path / "checkpoints", 1, model, {"optimizer": optimizer.state_dict()})
    best = checkpoint.host_copy(model)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < size / 4, (torch.cuda.max_memory_allocated() - base, size)
    assert all(t.device.type == "cpu" for t in best.values())
    reloaded = vitzoo.create("vit_s16", num_classes=10)
    checkpoint.load(checkpoint.latest(tmp_path / "checkpoints"), reloaded)
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in best.items())
