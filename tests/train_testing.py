"""What the training tests share: a tiny ViT trained for a few steps on synthetic data, on the CPU,
and a snapshot of a directory's files to show that nothing was changed."""

import hashlib
import json
from pathlib import Path

from vitzoo.train import TrainConfig

TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


def tiny_config(tmp_path=None, **changes) -> TrainConfig:
    options = dict(TINY)
    options.update(changes.pop("model_options", {}))
    base = dict(model="vit_ti16", model_options=options, data="synthetic",
                train_limit=256, test_limit=128,
                batch_size=32, steps=8, lr=3e-3, warmup=2, log_every=1,
                checkpoint_every=0, quiet=True,
                tensorboard=False, device="cpu",
                out=str(tmp_path / "run") if tmp_path is not None else None)
    base.update(changes)
    return TrainConfig(**base)


def losses(run: Path) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if "loss" in r]


def summary_of(root: Path) -> dict:
    return json.loads((root / "run" / "summary.json").read_text())


def short_config(out, **changes) -> TrainConfig:
    """A two-step run of the tiny ViT into `out`."""
    base = dict(out=str(out), train_limit=64, test_limit=32, batch_size=16, steps=2, warmup=1)
    return tiny_config(**{**base, **changes})


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (hidden ones too) and a hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}
