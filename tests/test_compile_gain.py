"""compile="auto" (vitzoo/inference.py, vitzoo/compile_gain.py): compiled only where that measured
faster, the gain kept for the next process only where it can be trusted (its repeats agree, it is
plausible for the model's FLOPs), and a kept gain checked at each use. Timings are faked: nothing here
depends on how busy the machine is."""

import json
import os
from pathlib import Path

import pytest
import torch

import vitzoo
import vitzoo.inference
from vitzoo import compile_gain
from vitzoo.inference import COMPILE_CACHE


@pytest.fixture
def compiling(monkeypatch, tmp_path):
    """compile="auto" measured (the suite keeps it eager otherwise) into an empty cache. `fake(eager=...,
    compiled=...)` scripts the seconds per call of each path (a number: every timing; a list: one each)
    and fakes the compilation (its compiled call runs the model eagerly), logging the batch shapes
    compiled on; `timed` logs which path was timed; `least_s`: the FLOPs' bound (0: none)."""
    monkeypatch.delenv("VITZOO_COMPILE", raising=False)
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path / "cache"))

    class Compiled(list):
        least_s = 0.0
        timed: list = []

        def fake(self, eager=1.0, compiled=1.0, fails=False, real_compilation=False):
            script = {name: iter(s) if isinstance(s, list) else None for name, s in (("eager", eager), ("compiled", compiled))}

            def timed(name, run, example, calls=2):
                self.timed.append(name)
                run(example)  # for its output: a watched call returns what it computed
                if script[name] is None:
                    return eager if name == "eager" else compiled
                return next(script[name])
            monkeypatch.setattr(compile_gain, "timed", timed)
            monkeypatch.setattr(compile_gain, "least_seconds", lambda model, example, run: self.least_s)
            if real_compilation:
                return

            def compile_on(fast, example):
                self.append(list(example.shape))
                if fails:
                    raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")
                model = fast.model
                model._compiled_call_impl = lambda *args, **kwargs: model._call_impl(*args, **kwargs)
                with torch.inference_mode():  # as the real compilation's first call, which compiles on it
                    fast.model(example)
            monkeypatch.setattr(vitzoo.inference.Inference, "compile_on", compile_on)

        def kept(self):
            path = Path(os.environ["VITZOO_CACHE"]) / COMPILE_CACHE
            return list(json.loads(path.read_text()).values()) if path.exists() else []

    return Compiled()


def fast_tiny(tiny, **kwargs):
    return vitzoo.inference.for_inference(vitzoo.create("vit_ti16", **tiny), torch.float32, **kwargs)


X = torch.randn(2, 3, 32, 32)


@pytest.mark.slow
def test_compile_auto_keeps_the_really_compiled_model_where_it_measured_faster(compiling, tiny):
    """With a real compilation: eager and compiled timed in turns (the compiled call set aside for eager's
    turns), the compiled model kept and computing what the plain model computes."""
    compiling.fake(eager=1.0, compiled=0.5, real_compilation=True)
    model = vitzoo.create("vit_ti16", **tiny).eval()
    with torch.inference_mode():
        exact = model(X)
    fast = vitzoo.inference.for_inference(model, torch.float32, compile="auto", example=X)
    assert fast.compiled and model._compiled_call_impl is not None and "2.00x eager" in fast.describe()
    assert compiling.timed == ["eager", "compiled", "compiled", "eager", "eager", "compiled"]  # in turns
    torch.testing.assert_close(fast(X), exact, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast.eager_call(X), exact, rtol=1e-4, atol=1e-4)
    assert list(fast.model.state_dict()) == list(vitzoo.create("vit_ti16", **tiny).state_dict())


def test_where_compiled_measured_slower_the_model_runs_eagerly_again(compiling, tiny):
    compiling.fake(eager=1.0, compiled=1.2)
    fast = fast_tiny(tiny, example=X)
    assert not fast.compiled and fast.model._compiled_call_impl is None
    assert fast.describe().endswith("compiled ran at 0.83x eager on a batch of [2, 3, 32, 32]")
    later = fast_tiny(tiny)
    later(X)
    assert not later.compiled and len(compiling) == 1  # neither measured nor compiled again
    assert later.describe().endswith("compiled ran at 0.83x eager on a batch of [2, 3, 32, 32] (measured before)")


def test_the_first_batch_settles_compilation_and_the_next_process_checks_the_kept_gain_at_use(compiling, tiny):
    compiling.fake(eager=1.0, compiled=0.8)  # compiled: 1.25x eager
    fast = fast_tiny(tiny)
    assert compiling == [] and "eager: decided at the first call" in fast.describe()
    fast(X)
    fast(X)
    assert compiling == [[2, 3, 32, 32]] and fast.compiled
    assert len(compiling.timed) == 2 * compile_gain.REPEATS + 2  # the measurement, then two watched calls
    assert fast.describe().endswith("compiled: 1.25x eager on a batch of [2, 3, 32, 32]")
    (kept,) = compiling.kept()
    assert kept == {"gain": 1.25, "spread": 0.0, "eager_s": 1.0, "compiled_s": 0.8, "least_s": 0.0}
    (key,) = json.loads((Path(os.environ["VITZOO_CACHE"]) / COMPILE_CACHE).read_text())
    assert json.loads(key)["input"] == [2, 3, 32, 32] and "threads" in json.loads(key)
    # the next process compiles at once, and times compiled against eager once at this use
    compiling.timed.clear()
    again = fast_tiny(tiny)
    again(X)
    assert again.compiled and len(compiling) == 2 and compiling.timed == ["eager", "compiled", "compiled"]  # + the call
    assert again.describe().endswith("1.25x eager on a batch of [2, 3, 32, 32] (measured before; 1.25x at this use)")


def test_a_kept_gain_that_turns_out_slower_at_use_is_measured_again(compiling, tiny):
    compiling.fake(eager=1.0, compiled=0.5)
    fast_tiny(tiny, example=X)
    assert compiling.kept()[0]["gain"] == 2.0
    compiling.fake(eager=1.0, compiled=1.5)  # at this use compiled is slower: another machine's load, say
    compiling.timed.clear()
    slower = fast_tiny(tiny, example=X)
    assert not slower.compiled and slower.model._compiled_call_impl is None
    assert len(compiling.timed) == 2 * (compile_gain.CHECK_REPEATS + compile_gain.REPEATS)
    assert slower.describe().endswith("measured again, as it ran at 0.67x eager at this use: compiled ran at 0.67x eager "
                                      "on a batch of [2, 3, 32, 32]")
    assert [k["gain"] for k in compiling.kept()] == [0.666667]
    fast_tiny(tiny, example=X)
    assert len(compiling) == 2  # the third process no longer compiles


def test_a_46x_gain_for_a_2_layer_model_is_implausible_so_neither_used_nor_kept(compiling, tiny):
    """The gain the issue found cached: eager timed while another process took the CPU."""
    compiling.fake(eager=1.0, compiled=1 / 46)
    fast = fast_tiny(tiny, example=X)
    assert not fast.compiled and compiling.kept() == []
    assert "compiled ran at 46.00x eager" in fast.describe() and f"at most {compile_gain.MAX_GAIN:.2f}x" in fast.describe()
    fast_tiny(tiny, example=X)
    assert len(compiling) == 2  # measured again by the next process


def test_a_gain_beyond_what_the_models_flops_allow_is_implausible(compiling, tiny):
    """Compiled at 0.3 s a call where the model's FLOPs need at least 0.4 s: at most 2.5x eager's 1.0 s."""
    compiling.least_s = 0.4
    compiling.fake(eager=1.0, compiled=0.3)
    fast = fast_tiny(tiny, example=X)
    assert not fast.compiled and compiling.kept() == [] and "implausible" in fast.describe()
    assert "at most 2.50x" in fast.describe()
    compiling.fake(eager=1.0, compiled=0.5)  # 2x, within the bound: used and kept
    assert fast_tiny(tiny, example=X).compiled and compiling.kept()[0]["least_s"] == 0.4


def test_a_gain_whose_repeats_disagree_is_used_but_not_kept(compiling, tiny):
    compiling.fake(eager=[1.0, 1.0, 1.0], compiled=[0.5, 0.9, 0.5])  # 2.0x, 1.11x, 2.0x
    fast = fast_tiny(tiny, example=X)
    assert fast.compiled and compiling.kept() == []
    assert fast.describe().endswith("2.00x eager on a batch of [2, 3, 32, 32]; noisy: its 3 repeats spread 44%, so not kept")


def test_a_machine_that_cannot_compile_runs_eagerly_warning_why(compiling, tiny):
    compiling.fake(fails=True)
    model = vitzoo.create("vit_ti16", **tiny).eval()
    with torch.inference_mode():
        exact = model(X)
    fast = vitzoo.inference.for_inference(model, torch.float32)
    with pytest.warns(RuntimeWarning, match="could not compile the model here.*InvalidCxxCompiler"):
        torch.testing.assert_close(fast(X), exact)
    assert not fast.compiled and "compilation failed (RuntimeError)" in fast.describe() and compiling.timed == []
    later = fast_tiny(tiny)
    later(X)
    assert len(compiling) == 1 and "failed to compile here before" in later.describe()


def test_compile_true_compiles_at_the_first_batch_and_a_refused_batch_settles_nothing(compiling, tiny):
    compiling.fake()
    fast = fast_tiny(tiny, compile=True)
    with pytest.raises(ValueError, match="32"):  # the model's own check of the image size, not a compile error
        fast(torch.randn(2, 3, 48, 48))
    assert not fast.compiled
    fast(X)
    assert fast.compiled and fast.describe().endswith("compiled: asked for") and compiling.timed == []
    assert compiling == [[2, 3, 48, 48], [2, 3, 32, 32]]


def test_vitzoo_compile_0_keeps_auto_eager_without_measuring(compiling, monkeypatch, tiny):
    compiling.fake()
    monkeypatch.setenv("VITZOO_COMPILE", "0")
    fast = fast_tiny(tiny)
    fast(X)
    assert compiling == [] and fast.describe().endswith("eager: VITZOO_COMPILE=0 (not measured)")


def test_the_least_time_is_the_models_flops_at_twice_the_products_speed(monkeypatch, tiny):
    """Counted over one real call (a fused attention kernel unseen: at most count_flops' figure, which
    counts the attention's products too), at a faked 100 GFLOP/s."""
    monkeypatch.setattr(compile_gain, "time_matmul", lambda rows, inner, outer, dtype, budget_s, device: 100.0)
    model = vitzoo.create("vit_ti16", **tiny).eval()
    with torch.inference_mode():
        least = compile_gain.least_seconds(model, X, model)
    paper = 2 * vitzoo.count_flops(model, computed=True) / (compile_gain.FLOP_MARGIN * 100e9)
    assert 0.7 * paper <= least <= paper


def test_load_after_settling_moves_the_calls_to_eager_and_back_checking_once_in_16_calls(compiling, tiny):
    """Compiled settled at 0.5 s a call (2x eager); then another process makes compiled calls take 2.0 s
    and eager ones 1.2 s: the 16th call checks eager, which is faster, and the calls go eagerly; once the
    load is gone, the next check finds compiled faster again. Each check costs one call of the other path."""
    model = vitzoo.create("vit_ti16", **tiny).eval()
    with torch.inference_mode():
        exact = model(X)
    compiling.fake(eager=1.0, compiled=0.5)
    fast = vitzoo.inference.for_inference(model, torch.float32, example=X)
    assert fast.compiled and fast.watch == ((2, 3, 32, 32), 0.5)
    compiling.fake(eager=1.2, compiled=2.0)
    compiling.timed.clear()
    for _ in range(vitzoo.inference.RECHECK_EVERY):
        torch.testing.assert_close(fast(X), exact)
    assert compiling.timed == ["compiled"] * vitzoo.inference.RECHECK_EVERY + ["eager"] and fast.eager_now
    assert fast.describe().endswith("; eager since call 16, where compiled ran at 0.60x eager")
    compiling.timed.clear()
    for _ in range(vitzoo.inference.RECHECK_EVERY):
        torch.testing.assert_close(fast(X), exact)
    assert compiling.timed == ["eager"] * vitzoo.inference.RECHECK_EVERY + ["compiled"] and fast.eager_now  # still slower
    compiling.fake(eager=1.2, compiled=0.5)  # the other process is done
    for _ in range(vitzoo.inference.RECHECK_EVERY):
        fast(X)
    assert not fast.eager_now and fast.describe().endswith("; compiled again since call 48")
    compiling.timed.clear()
    fast(torch.randn(3, 3, 32, 32))  # another batch shape is not watched (nor timed)
    assert compiling.timed == []


def test_a_compiled_call_that_is_slower_but_not_by_half_is_not_checked(compiling, tiny):
    compiling.fake(eager=1.0, compiled=0.5)
    fast = fast_tiny(tiny, example=X)
    compiling.fake(eager=1.0, compiled=0.7)  # slower than settled (0.5), not 1.5x: nothing to check
    compiling.timed.clear()
    for _ in range(2 * vitzoo.inference.RECHECK_EVERY):
        fast(X)
    assert compiling.timed == ["compiled"] * 2 * vitzoo.inference.RECHECK_EVERY and not fast.eager_now
