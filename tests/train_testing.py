"""What the training tests share: a tiny ViT trained for a few steps on synthetic data on the CPU,
its files read back, and a snapshot of a folder to show that nothing changed."""

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from vitzoo.train import TrainConfig

TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


def tiny_config(tmp_path=None, **changes) -> TrainConfig:
    """8 steps of batch 32 on 256 synthetic images into tmp_path/run (None: nothing written)."""
    base = dict(model="vit_ti16", model_options={**TINY, **changes.pop("model_options", {})},
                data="synthetic", train_limit=256, test_limit=128, batch_size=32, steps=8, lr=3e-3,
                warmup=2, log_every=1, checkpoint_every=0, quiet=True, tensorboard=False,
                device="cpu", out=str(tmp_path / "run") if tmp_path is not None else None)
    return TrainConfig(**{**base, **changes})


def short_config(out, **changes) -> TrainConfig:
    """A two-step run of the tiny ViT into `out`."""
    base = dict(out=str(out), train_limit=64, test_limit=32, batch_size=16, steps=2, warmup=1)
    return tiny_config(**{**base, **changes})


def flags(**settings) -> list[str]:
    """`vitzoo train`'s flags for TrainConfig and model settings."""
    return [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]


def lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in lines(run) if "loss" in r]


def summary_of(root: Path) -> dict:
    return json.loads((root / "run" / "summary.json").read_text())


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (hidden ones too) and a hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def torchrun(processes: int, *args: str) -> None:
    """`vitzoo train ARGS` in `processes` gloo processes of one thread, launched by torchrun."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "vitzoo", "train",
               "--device", "cpu", "--quiet", "--no-tensorboard", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
