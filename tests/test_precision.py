"""One module owns numeric precision (vitzoo/precision.py): the names, their dtypes and the rule of
which precision a device computes in; training, inference and the benchmarks read it there."""

import ast
from pathlib import Path

import pytest
import torch

from vitzoo import precision
from vitzoo.errors import ConfigError
from vitzoo.train import TrainConfig
from vitzoo.train.build import resolve_precision

ROOT = Path(__file__).resolve().parents[1]
CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


def test_every_spelling_names_its_dtype_and_the_flag_goes_back():
    for long, short, dtype in (("float32", "fp32", torch.float32), ("bfloat16", "bf16", torch.bfloat16),
                               ("float16", "fp16", torch.float16)):
        assert precision.dtype_named(long) == precision.dtype_named(short) == dtype
        assert precision.flag(dtype) == short and precision.NAMES[dtype] == long
    assert precision.flag(None) == "fp32"  # autocast's "none": float32
    with pytest.raises(ValueError, match="--precision='half': use one of float32, .*bf16, fp16"):
        precision.dtype_named("half", "--precision")


def test_the_training_options_take_the_precisions_that_the_module_names():
    assert TrainConfig(precision="gpu-half").precision == "gpu-half"
    for value in precision.PRECISIONS:
        TrainConfig(precision=value)
    with pytest.raises(ConfigError, match="precision='bfloat16' is not one of auto, gpu-half, fp32, bf16, fp16"):
        TrainConfig(precision="bfloat16")


@pytest.mark.parametrize(("native", "half"), [(True, torch.bfloat16), (False, torch.float16)])
def test_the_gpu_rule_is_one_for_training_inference_and_the_benchmarks(monkeypatch, native, half):
    monkeypatch.setattr(precision, "native_bf16", lambda device: native)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    measured = lambda: pytest.fail("a GPU was measured")  # noqa: E731
    assert precision.half_of(GPU) == half and precision.half_of(CPU) == torch.bfloat16
    assert precision.choose(GPU, training=False, measure_cpu=measured).dtype == half
    for rule in precision.RULES:
        assert precision.training_dtype(rule, GPU, measured) == half
    assert precision.training_dtype("gpu-half", CPU) is None  # float32 on the CPU, nothing measured


def test_auto_on_the_cpu_trains_in_what_the_measurement_says_and_fp16_needs_cuda():
    assert precision.training_dtype("auto", CPU, lambda: torch.bfloat16) == torch.bfloat16
    assert precision.training_dtype("auto", CPU, lambda: torch.float32) is None
    with pytest.raises(ValueError, match="measured on the model"):
        precision.training_dtype("auto", CPU)
    with pytest.raises(ConfigError, match="fp16 needs CUDA"):
        precision.training_dtype("fp16", CPU)
    assert precision.training_dtype("bf16", CPU) == torch.bfloat16


def test_training_with_several_processes_takes_rank_0s_choice(monkeypatch):
    """Training adds one thing to the rule: every process computes in rank 0's precision."""
    from types import SimpleNamespace

    from vitzoo.train import build

    monkeypatch.setattr(build, "fastest_precision", lambda *args, **kwargs: precision.Choice(torch.float32, "this rank"))
    gathered = []
    monkeypatch.setattr(build, "gather_objects", lambda value, env: gathered.append(value) or ["bf16", value])
    env = SimpleNamespace(world_size=2)
    assert resolve_precision(TrainConfig(precision="auto"), CPU, torch.nn.Linear(2, 2), env=env) == torch.bfloat16
    assert gathered == ["fp32"]


def test_no_other_module_keeps_a_table_of_precision_names():
    """A dict from names to torch's half dtypes anywhere but vitzoo/precision.py is a second owner of the
    names, which drifts (five modules kept one before)."""
    owners = []
    for path in [*(ROOT / "vitzoo").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys) \
                    and any(isinstance(v, ast.Attribute) and v.attr in ("bfloat16", "float16") for v in node.values):
                owners.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert owners == ["vitzoo/precision.py:" + str(_fixed_line())], owners


def _fixed_line() -> int:
    source = (ROOT / "vitzoo" / "precision.py").read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if line.startswith("FIXED = {"))
