"""The precision a device computes fastest in follows from what it reports (vitzoo/precision.py):
a GPU's bf16 support, a CPU's instruction-set flags; training's rules; the precisions' names."""

import pytest
import torch

from vitzoo import precision
from vitzoo.errors import ConfigError
from vitzoo.train import TrainConfig

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(("native", "half"), [(True, torch.bfloat16), (False, torch.float16)])
def test_a_gpu_computes_in_bf16_where_native_else_in_fp16(monkeypatch, native, half):
    monkeypatch.setattr(precision, "native_bf16", lambda device: native)
    assert precision.fastest(GPU).dtype == precision.half_of(GPU) == half
    assert all(precision.training_dtype(rule, GPU) == half for rule in precision.RULES)


@pytest.mark.parametrize(("flags", "dtype"), [
    ({"avx2", "avx512f", "amx_tile", "amx_bf16"}, torch.bfloat16),
    ({"avx2", "avx512f", "avx512_bf16"}, torch.bfloat16),
    ({"avx2", "avx512f", "avx512_fp16"}, torch.float32), (set(), torch.float32),
], ids=["amx_bf16", "avx512_bf16", "no-bf16", "no-flags"])
def test_a_cpu_computes_in_bf16_where_it_has_bf16_instructions_else_in_float32(flags, dtype,
                                                                                monkeypatch):
    assert str(precision.fastest(CPU, frozenset(flags))).startswith(
        precision.NAMES[dtype] + ": the CPU has")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))  # this machine's
    assert precision.fastest("cpu").dtype == dtype
    assert precision.fastest("mps").dtype == torch.bfloat16


def test_training_on_a_cpu_computes_in_float32_unless_bf16_is_asked_for(monkeypatch):
    """Whatever the CPU's flags, so that a run's numbers do not depend on the CPU it lands on."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"amx_bf16", "avx512_bf16"}))
    assert all(precision.training_dtype(rule, CPU) is None for rule in precision.RULES)
    assert precision.training_dtype("bf16", CPU) == torch.bfloat16
    with pytest.raises(ConfigError, match="fp16 needs CUDA"):
        precision.training_dtype("fp16", CPU)


def test_every_spelling_names_its_dtype_and_training_takes_the_flags():
    for long, short, dtype in (("float32", "fp32", torch.float32),
                               ("bfloat16", "bf16", torch.bfloat16),
                               ("float16", "fp16", torch.float16)):
        assert precision.SPELLINGS[long] == precision.SPELLINGS[short] == dtype
        assert precision.flag(dtype) == short and precision.NAMES[dtype] == long
    assert precision.flag(None) == "fp32"  # autocast's "none": float32
    assert all(TrainConfig(precision=value).precision == value for value in precision.PRECISIONS)
    with pytest.raises(ConfigError, match="precision='bfloat16' is not one of auto, gpu-half, "
                                          "fp32, bf16, fp16"):
        TrainConfig(precision="bfloat16")
