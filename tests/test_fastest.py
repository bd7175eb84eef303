"""The fastest precision of a machine (vitzoo/fastest.py): picked by a fixed rule from measured speeds,
measured once per machine, behind `vitzoo.fast.for_inference(model)` and `vitzoo train --precision auto`;
benchmarks never take it."""

import json
import os
from pathlib import Path

import pytest
import torch

import vitzoo
import vitzoo.fast
from vitzoo import fastest
from vitzoo.fastest import pick

# measured speeds (GFLOP/s at ViT-B/16's MLP product) of three CPUs
AMD_EPYC = {"float32": 66.0, "bfloat16": 154.0, "float16": 2.6}  # avx512_bf16, no avx512_fp16
XEON_NO_AMX = {"float32": 309.0, "bfloat16": 170.0, "float16": 316.0}  # avx512_fp16, bf16 without AMX
NO_HALF = {"float32": 100.0, "bfloat16": 104.0, "float16": 1.0}
FP16_FAST = {"float32": 300.0, "bfloat16": 170.0, "float16": 600.0}  # avx512_fp16 with AMX-FP16, say


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """The CPU measured for real choices (the suite fixes float32 otherwise), into an empty cache; returns
    the log of measurements, which `speeds` fakes."""
    monkeypatch.delenv("VITZOO_CPU_PRECISION", raising=False)
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path / "cache"))
    class Measured(list):
        pass

    measured = Measured()

    def fake(speeds):
        monkeypatch.setattr(fastest, "measure_cpu", lambda shape: measured.append(shape) or dict(speeds))

    measured.fake = fake
    return measured


# ---------------------------------------------------------------------------- the rule
def test_half_precision_is_picked_where_the_cpu_computes_it_clearly_faster():
    assert pick(AMD_EPYC, tuple(fastest.NAMES)).dtype == torch.bfloat16
    assert pick(FP16_FAST, tuple(fastest.NAMES)).dtype == torch.float16
    # the Xeon of the issue: bf16 at half of float32's speed, fp16 2% faster than float32 (for_inference in
    # fp16 there: 1.07x eager float32, and compiled float32 the fastest of all): float32
    assert pick(XEON_NO_AMX, tuple(fastest.NAMES)).dtype == torch.float32
    assert pick(NO_HALF, tuple(fastest.NAMES)).dtype == torch.float32  # 4% faster does not pay for the rounding


def test_a_near_tie_between_the_half_precisions_goes_to_bf16_whose_range_is_float32s():
    assert pick({"float32": 100.0, "bfloat16": 200.0, "float16": 205.0}, tuple(fastest.NAMES)).dtype == torch.bfloat16
    assert pick({"float32": 100.0, "bfloat16": 200.0, "float16": 260.0}, tuple(fastest.NAMES)).dtype == torch.float16


def test_training_picks_between_float32_and_bf16_only():
    """Autocast has no fp16 on the CPU: where bf16 is slow, training stays in float32."""
    assert pick(XEON_NO_AMX, (torch.float32, torch.bfloat16)).dtype == torch.float32
    choice = pick(AMD_EPYC, (torch.float32, torch.bfloat16))
    assert choice.dtype == torch.bfloat16 and "154" in choice.reason and "66" in choice.reason


def test_a_gpu_is_not_measured_it_says_what_it_computes_natively(monkeypatch):
    """One rule for a GPU's half precision (`precision.gpu_half`): the measured choice, the fast path's
    default and training's gpu-half and auto all follow it."""
    from vitzoo import fast, precision
    from vitzoo.train import TrainConfig
    from vitzoo.train.build import resolve_precision

    monkeypatch.setattr(fastest, "measure_cpu", lambda shape: pytest.fail("a GPU was measured"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    model = vitzoo.create("vit_ti16", img_size=32, patch_size=8, num_classes=5)
    gpu = torch.device("cuda", 0)
    for native, expected in ((True, torch.bfloat16), (False, torch.float16)):
        monkeypatch.setattr(precision, "native_bf16", lambda device, native=native: native)
        assert fastest.fastest_precision(model, gpu).dtype == expected
        assert fast.inference_dtype(gpu) == expected
        for rule in ("gpu-half", "auto"):
            assert resolve_precision(TrainConfig(model="vit_ti16", precision=rule), gpu) == expected


# ---------------------------------------------------------------------------- measured once per machine
def test_the_measurement_runs_once_per_machine_and_shape_and_again_for_another_torch(measuring, monkeypatch, tmp_path):
    measuring.fake(AMD_EPYC)
    model = vitzoo.create("vit_ti16", img_size=32, patch_size=8, num_classes=5)
    assert fastest.fastest_precision(model, "cpu").dtype == torch.bfloat16
    assert fastest.fastest_precision(model, "cpu").dtype == torch.bfloat16
    assert measuring == [(8 * 17, 192, 768)]  # the MLP's first layer at 8 images of 16 + 1 tokens, once
    cached = json.loads((tmp_path / "cache" / fastest.CACHE_NAME).read_text())
    (key,) = cached
    assert {"cpu", "flags", "torch", "threads", "shape"} <= set(json.loads(key)) and cached[key] == AMD_EPYC
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    fastest.fastest_precision(model, "cpu")
    assert len(measuring) == 2


def test_an_unreadable_cache_is_measured_again_and_rewritten(measuring, tmp_path):
    measuring.fake(NO_HALF)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / fastest.CACHE_NAME).write_text("{not json")
    model = vitzoo.create("vit_ti16", img_size=32, patch_size=8, num_classes=5)
    assert fastest.fastest_precision(model, "cpu").dtype == torch.float32
    assert len(json.loads((tmp_path / "cache" / fastest.CACHE_NAME).read_text())) == 1


def test_the_real_measurement_times_every_precision_on_this_cpu():
    speeds = fastest.measure_cpu((64, 64, 256))
    assert set(speeds) == {"float32", "bfloat16", "float16"} and all(v > 0 for v in speeds.values())


def test_a_fixed_cpu_precision_skips_the_measurement_and_a_wrong_one_is_named(monkeypatch):
    monkeypatch.setattr(fastest, "measure_cpu", lambda shape: pytest.fail("measured"))
    model = vitzoo.create("vit_ti16", img_size=32, patch_size=8, num_classes=5)
    monkeypatch.setenv("VITZOO_CPU_PRECISION", "bfloat16")
    assert fastest.fastest_precision(model, "cpu").dtype == torch.bfloat16
    monkeypatch.setenv("VITZOO_CPU_PRECISION", "float16")
    assert fastest.fastest_precision(model, "cpu", training=True).dtype == torch.float32  # no fp16 autocast on CPUs
    monkeypatch.setenv("VITZOO_CPU_PRECISION", "fp16")
    with pytest.raises(ValueError, match="VITZOO_CPU_PRECISION='fp16'.*float16"):
        fastest.fastest_precision(model, "cpu")


# ---------------------------------------------------------------------------- vitzoo.fast
@pytest.mark.parametrize(("speeds", "expected"), [(AMD_EPYC, torch.bfloat16), (FP16_FAST, torch.float16),
                                                  (XEON_NO_AMX, torch.float32)], ids=["bf16", "fp16", "float32"])
def test_for_inference_with_no_arguments_computes_in_the_measured_fastest_precision(measuring, speeds, expected, tiny):
    measuring.fake(speeds)
    model = vitzoo.create("vit_ti16", **tiny).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        exact = model(x)
    fast = vitzoo.fast.for_inference(model)
    assert fast.dtype == expected and all(p.dtype == expected for p in fast.model.parameters())
    assert fast.describe().startswith(fastest.NAMES[expected] + ": ") and "GFLOP/s" in fast.describe()
    assert (fast(x).float() - exact).abs().max() <= 0.03 * exact.abs().max()
    assert vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), "auto").dtype == expected


def test_an_explicit_dtype_is_kept_and_said(measuring, tiny):
    measuring.fake(AMD_EPYC)
    fast = vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32, compile=False)
    assert fast.dtype == torch.float32 and fast.describe() == "float32: asked for; eager: not asked for"
    assert measuring == []
    with pytest.raises(ValueError, match="'auto' or one of"):
        vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), "bf16")


@pytest.fixture
def compiling(monkeypatch, tmp_path):
    """compile="auto" measured (the suite keeps it eager otherwise) into an empty cache; `fake(eager_s,
    compiled_s)` fakes the timings and the compilation, logging the batch shapes compiled on."""
    monkeypatch.delenv("VITZOO_COMPILE", raising=False)
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path / "cache"))

    class Compiled(list):
        def fake(self, *seconds, fails=False):
            timings = iter(seconds)
            monkeypatch.setattr(vitzoo.fast, "_seconds_per_call", lambda fast, example: next(timings))

            def compile_on(fast, example):
                self.append(list(example.shape))
                if fails:
                    raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")
                with torch.inference_mode():  # as the real compilation's first call, which compiles on it
                    fast.model(example)
            monkeypatch.setattr(vitzoo.fast.Inference, "compile_on", compile_on)

    return Compiled()


@pytest.mark.slow
@pytest.mark.parametrize("compiled_faster", [True, False])
def test_compile_auto_keeps_the_compiled_model_only_where_it_measured_faster(compiling, monkeypatch, tiny, compiled_faster):
    model = vitzoo.create("vit_ti16", **tiny).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        exact = model(x)
    timings = iter([1.0, 0.5 if compiled_faster else 1.2])  # eager's seconds per call, then compiled's
    monkeypatch.setattr(vitzoo.fast, "_seconds_per_call", lambda fast, example: next(timings))
    fast = vitzoo.fast.for_inference(model, torch.float32, compile="auto", example=x)
    assert fast.compiled is compiled_faster
    assert (model._compiled_call_impl is not None) is compiled_faster  # eager really runs eagerly again
    assert ("2.00x eager" if compiled_faster else "0.83x eager") in fast.describe()
    torch.testing.assert_close(fast(x), exact, rtol=1e-4, atol=1e-4)
    assert list(fast.model.state_dict()) == list(vitzoo.create("vit_ti16", **tiny).state_dict())


def test_with_no_arguments_the_first_batch_settles_compilation_and_the_machine_remembers_it(compiling, tiny):
    compiling.fake(1.0, 0.8)  # compiled: 1.25x eager
    fast = vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32)
    assert compiling == [] and "eager: decided at the first call" in fast.describe()
    x = torch.randn(2, 3, 32, 32)
    fast(x)
    fast(x)
    assert compiling == [[2, 3, 32, 32]] and fast.compiled
    assert fast.describe().endswith("compiled: 1.25x eager on a batch of [2, 3, 32, 32]")
    # the next process (a fresh model) compiles at once: nothing measured (no timings are left)
    again = vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32)
    again(x)
    assert again.compiled and "(measured before)" in again.describe() and len(compiling) == 2
    cached = json.loads((Path(os.environ["VITZOO_CACHE"]) / vitzoo.fast.COMPILE_CACHE).read_text())
    (key,) = cached
    assert cached[key] == 1.25 and json.loads(key)["input"] == [2, 3, 32, 32] and "threads" in json.loads(key)


def test_where_compiling_did_not_pay_it_is_not_compiled_again(compiling, tiny):
    compiling.fake(1.0, 1.0)  # compiled as fast as eager: not worth its compilation
    x = torch.randn(2, 3, 32, 32)
    fast = vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32)
    fast(x)
    assert not fast.compiled and "compiled ran at 1.00x eager" in fast.describe() and len(compiling) == 1
    later = vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32)
    later(x)
    assert not later.compiled and len(compiling) == 1  # neither measured nor compiled


def test_a_machine_that_cannot_compile_runs_eagerly_warning_why(compiling, tiny):
    compiling.fake(1.0, fails=True)
    model = vitzoo.create("vit_ti16", **tiny).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        exact = model(x)
    fast = vitzoo.fast.for_inference(model, torch.float32)
    with pytest.warns(RuntimeWarning, match="could not compile the model here.*InvalidCxxCompiler"):
        torch.testing.assert_close(fast(x), exact)
    assert not fast.compiled and "compilation failed (RuntimeError)" in fast.describe()
    later = vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32)
    later(x)
    assert len(compiling) == 1 and "failed to compile here before" in later.describe()


def test_compile_true_compiles_at_the_first_batch_and_a_refused_batch_settles_nothing(compiling, tiny):
    compiling.fake()
    fast = vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32, compile=True)
    with pytest.raises(ValueError, match="32"):  # the model's own check of the image size, not a compile error
        fast(torch.randn(2, 3, 48, 48))
    assert not fast.compiled
    fast(torch.randn(2, 3, 32, 32))
    assert fast.compiled and fast.describe().endswith("compiled: asked for")
    assert compiling == [[2, 3, 48, 48], [2, 3, 32, 32]]


def test_vitzoo_compile_0_keeps_auto_eager_without_measuring(compiling, monkeypatch, tiny):
    compiling.fake()
    monkeypatch.setenv("VITZOO_COMPILE", "0")
    fast = vitzoo.fast.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32)
    fast(torch.randn(2, 3, 32, 32))
    assert compiling == [] and fast.describe().endswith("eager: VITZOO_COMPILE=0 (not measured)")


# ---------------------------------------------------------------------------- training
def test_train_precision_auto_takes_bf16_on_a_cpu_only_where_it_measured_faster(measuring):
    from vitzoo.train import TrainConfig
    from vitzoo.train.build import resolve_precision

    model = vitzoo.create("vit_ti16", img_size=32, patch_size=8, num_classes=5)
    auto = TrainConfig(model="vit_ti16", precision="auto").resolved()
    measuring.fake(AMD_EPYC)
    assert resolve_precision(auto, torch.device("cpu"), model) == torch.bfloat16
    measuring.fake(XEON_NO_AMX)
    assert resolve_precision(auto, torch.device("cpu"), model, micro_batch=16) is None  # float32
    fixed = TrainConfig(model="vit_ti16", precision="gpu-half").resolved()
    assert resolve_precision(fixed, torch.device("cpu"), model) is None


def test_benchmark_runs_compute_in_a_fixed_precision_whatever_the_cpu_measures(measuring):
    """A benchmark's numbers must not change with the machine's measured choice: its runs train in the
    GPU's native half precision or float32 on the CPU, and their keys stay as they were."""
    from benchmarks.training import train_settings
    from vitzoo.train import TrainConfig
    from vitzoo.train.build import resolve_precision

    measuring.fake(AMD_EPYC)
    settings = train_settings({"train": {"epochs": 1}})
    assert settings["precision"] == "gpu-half"
    model = vitzoo.create("vit_ti16", img_size=32, patch_size=8, num_classes=5)
    assert resolve_precision(TrainConfig(model="vit_ti16", **settings).resolved(), torch.device("cpu"), model) is None
    assert measuring == []


# ---------------------------------------------------------------------------- fp16 on the CPU
@pytest.mark.slow
def test_fp16_inference_gives_the_float32_predictions_of_a_trained_model(tiny):
    from vitzoo.train import TrainConfig, Trainer

    trainer = Trainer.from_config(TrainConfig(model="vit_ti16", model_options=dict(tiny, num_classes=10), data="synthetic",
                                              train_limit=512, test_limit=64, steps=30, batch_size=32, device="cpu",
                                              quiet=True, tensorboard=False, checkpoint_every=0, precision="fp32",
                                              lr=3e-3, warmup=3))
    trainer.run()
    model = trainer.model.eval()
    x = torch.randn(64, 3, 32, 32)
    with torch.inference_mode():
        exact = model(x)
    half = vitzoo.fast.for_inference(model, torch.float16)(x).float()
    assert torch.isfinite(half).all()
    assert (half - exact).abs().max() <= 0.01 * exact.abs().max()
    assert (half.argmax(1) == exact.argmax(1)).float().mean() >= 0.95


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_b16", "vit_l16"])
def test_the_residual_stream_of_the_papers_models_stays_far_inside_fp16s_range(name):
    """fp16 overflows above 65504: at initialisation the largest value in any block's output or MLP hidden
    layer of ViT-B/16 and ViT-L/16 is under 1% of that, on images at the edge of the normalised range."""
    model = vitzoo.create(name).eval()
    largest = []
    hooks = [m.register_forward_hook(lambda m, i, out: largest.append(out.abs().max().item()))
             for block in model.encoder.blocks for m in (block, block.mlp.fc1)]
    with torch.inference_mode():
        model(torch.randn(1, 3, 224, 224).clamp(-3, 3) * 3)
    for hook in hooks:
        hook.remove()
    assert len(largest) == 2 * len(model.encoder.blocks) and max(largest) < 0.01 * torch.finfo(torch.float16).max
