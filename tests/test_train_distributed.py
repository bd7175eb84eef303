"""Eight CPU processes (gloo, launched by torchrun: an 8-GPU node's world size, rehearsed on 2 cores)
follow the same loss curve as one process with the same global batch, layer-wise decay and the moving
average of the weights included."""

import json
import os
import socket
import subprocess
import sys

import pytest
from train_testing import TINY

from vitzoo.train import TrainConfig, fit

ARGS = dict(data="synthetic", train_limit=256, test_limit=64, batch_size=32, steps=8, lr=3e-3, warmup=2,
            log_every=1, checkpoint_every=4, layer_decay=0.75, model_ema_decay=0.8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def curve(run) -> list[float]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if "loss" in r]


@pytest.mark.slow
def test_eight_processes_follow_the_one_process_loss_curve(tmp_path):
    # both runs on the CPU: on a GPU machine `auto` would pick CUDA (and bf16) for the reference alone
    fit(TrainConfig(model="vit_ti16", model_options=TINY, out=str(tmp_path / "one"), quiet=True, tensorboard=False,
                    device="cpu", fewshot=(1, 2), model_ema=True, **ARGS))
    # the eight-process run shares each global batch of 32 between the processes: one micro-batch of 4 each
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "8", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "vitzoo", "train", "vit_ti16", "--device", "cpu",
           "--out", str(tmp_path / "eight"), "--micro-batch", "4", "--quiet", "--no-tensorboard", "--fewshot", "1,2", "--model-ema"]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in {**TINY, **ARGS}.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    one, eight = curve(tmp_path / "one"), curve(tmp_path / "eight")
    assert len(one) == len(eight) == 8
    for a, b in zip(one, eight):
        assert abs(a - b) <= 1e-5, (one, eight)  # float rounding only (measured: ~4e-7)
    summary = json.loads((tmp_path / "eight" / "summary.json").read_text())
    reference = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["world_size"] == 8 and summary["status"] == "finished"
    assert abs(summary["test_top1"] - reference["test_top1"]) < 0.05
    # each process averages its own replica, which DDP keeps equal: the one process's average
    from safetensors.torch import load_file

    ema_one, ema_eight = (load_file(tmp_path / run / "model_ema.safetensors") for run in ("one", "eight"))
    raw_one, raw_eight = (load_file(tmp_path / run / "model.safetensors") for run in ("one", "eight"))
    # the averages differ no more than the weights averaged do: ~1e-7, except the key's bias, whose
    # gradient is zero but for rounding, which Adam scales up to whole steps (4e-5 here) in either run
    for k in ema_one:
        assert (ema_one[k] - ema_eight[k]).abs().max() <= (raw_one[k] - raw_eight[k]).abs().max() + 1e-6, k
    assert max(float((ema_one[k] - ema_eight[k]).abs().max()) for k in ema_one if "qkv.bias" not in k) <= 1e-5
    assert abs(summary["ema_test_top1"] - reference["ema_test_top1"]) < 0.05
    # the few-shot features are shared between the eight processes and gathered in order
    assert summary["fewshot"].keys() == reference["fewshot"].keys() == {"1", "2"}
    assert all(abs(summary["fewshot"][k] - reference["fewshot"][k]) < 0.05 for k in ("1", "2"))
