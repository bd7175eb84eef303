"""The scales an ablation runs at: the base model and training every cell varies, the seeds per
cell, and the time budget on the machine the scale is meant for.

| scale | for | base model | training | seeds | budget |
|---|---|---|---|---|---|
| `quick` | tests | D32, 1 layer, 7x7 patches | 512 images, 1 epoch | 1 | seconds |
| `main` | `./run.sh main` | MAIN_MODEL | MAIN_TRAIN | 2 | 6 min in all, 2 cores |
| `cpu` | a 2-core CPU | MAIN_MODEL | MAIN_TRAIN | 3 | 60 min an ablation, 4 h in all |
| `paper` | GPUs | ViT-B/16 at 224 px | Appendix D: batch 4096, 7 epochs | 3 | days |
| `gpu` | one 8-GPU node | the paper's cells at 128 px | batch 1024, 14 epochs | 3 | a day |
| `rehearsal` | a first GPU | the paper's cells shrunk | JPEGs, 2 processes a run | 2 | minutes |
"""

from __future__ import annotations

import dataclasses
import math

from benchmarks.spec import Scale

# what every small scale shares: AdamW, linear decay after a short warm-up, random flips
SMALL_RECIPE = dict(data="fashion-mnist", recipe="paper-pretrain", batch_size=128,
                    weight_decay=0.05, warmup=0.05, schedule="linear", clip_grad=1.0, hflip=True)

QUICK_MODEL = dict(img_size=28, patch_size=7, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
QUICK_TRAIN = dict(data="fashion-mnist", recipe="paper-pretrain", epochs=1.0, batch_size=64,
                   lr=1e-3, train_limit=512, test_limit=256, warmup=0.1)

# ViT D64, 4 layers, 7x7-pixel patches (16 tokens): 87.2% after 4 epochs in the trials
# (benchmarks/results/trials/main), over the 85% floor with a seed's spread
MAIN_MODEL = dict(img_size=28, patch_size=7, embed_dim=64, depth=4, num_heads=4, mlp_dim=128)
MAIN_TRAIN = dict(SMALL_RECIPE, lr=2e-3, epochs=4.0)

# Appendix D: ViT-B/16 at 224 px, batch 4096 accumulated from micro-batches of 64, JPEGs decoded
# by 8 loader workers; a checkpoint every 200 steps, so that a preempted job loses minutes
PAPER_MODEL = dict(img_size=224)
PAPER_TRAIN = dict(recipe="paper-pretrain", epochs=7.0, batch_size=4096, micro_batch=64,
                   num_workers=8, lr=8e-4, weight_decay=0.1, random_resized_crop=0.08, hflip=True,
                   checkpoint_every=200)

# a day on one 8-GPU node: 128 px (a third of 224's compute), DeiT's batch and lr, and twice
# Table 8's epochs, ImageNet-1k being smaller than JFT
GPU_MODEL = dict(img_size=128)
GPU_TRAIN = dict(PAPER_TRAIN, epochs=14.0, batch_size=1024, lr=1e-3, checkpoint_every=500)

# the paper's code path with every dimension shrunk: a JPEG folder in ImageNet's layout
# (benchmarks/rehearsal_data.py), 2 processes x 2 micro-batches x 4, a checkpoint every 10 steps
REHEARSAL_TRAIN = dict(PAPER_TRAIN, epochs=2.0, batch_size=16, micro_batch=4, num_workers=1,
                       checkpoint_every=10)
REHEARSAL_SIDE = 32  # pixels, for the paper's 224


def rehearsal_model(name: str, options: dict) -> dict:
    """The paper's model `name` shrunk, keeping what tells cells apart: width and MLP / 32, heads
    and depth / 4, patches / 4, a quarter of the ResNet's blocks in at most two stages, 32 px for
    224 (a multiple of the model's stride)."""
    import vitzoo

    config = vitzoo.get_config(name, **options)
    heads = max(1, config.num_heads // 4)
    width = max(heads * 8, config.embed_dim // 32 // heads * heads)
    shrunk = dict(options, embed_dim=width, num_heads=heads, mlp_dim=max(8, config.mlp_dim // 32),
                  depth=max(1, config.depth // 4) if config.depth else 0)
    if config.stem == "patch":
        shrunk["patch_size"] = stride = max(1, config.patch_size // 4)
    elif layers := config.stem_options.get("layers"):
        stages = min(2, len(layers))
        blocks = max(stages, math.ceil(sum(layers) / 4))
        shrunk["stem_options"] = {"layers": tuple(blocks // stages + (i < blocks % stages)
                                                  for i in range(stages))}
        stride = 4 * 2 ** (stages - 1) * config.patch_size
    else:  # the ResNet's root alone
        stride = 4 * config.patch_size
    side = config.img_size[0] * REHEARSAL_SIDE / 224
    shrunk["img_size"] = max(stride, round(side / stride) * stride)
    if config.head_options.get("representation_size"):
        shrunk["head_options"] = {"representation_size": width}
    return shrunk


SCALES = {
    "quick": Scale("quick", QUICK_MODEL, QUICK_TRAIN, seeds=1, budget_min=1.0),
    "main": Scale("main", MAIN_MODEL, MAIN_TRAIN, seeds=2, suite_budget_min=6.0),
    "cpu": Scale("cpu", dict(MAIN_MODEL), dict(MAIN_TRAIN), seeds=3, budget_min=60.0,
                 suite_budget_min=240.0),
    "paper": Scale("paper", PAPER_MODEL, PAPER_TRAIN, seeds=3, zoo_name="vit_b16"),
    "gpu": Scale("gpu", GPU_MODEL, GPU_TRAIN, seeds=3, zoo_name="vit_b16", cells_of="paper",
                 suite_budget_min=24 * 60.0),
    "rehearsal": Scale("rehearsal", PAPER_MODEL, REHEARSAL_TRAIN, seeds=2, zoo_name="vit_b16",
                       cells_of="paper", shrink=rehearsal_model, processes_per_run=2),
}


def get_scale(name: str, data: str | None = None) -> Scale:
    """The named scale, on `data` if given (the paper's and gpu scales need it: ImageNet is not
    shipped; the rehearsal's is the folder it writes)."""
    if name in ("paper", "gpu", "rehearsal") and not data:
        raise ValueError(f"--scale {name} needs --data (an ImageFolder directory such as "
                         "ImageNet's, its shards from `vitzoo shard`, cifar10 or cifar100)")
    train = dict(SCALES[name].train, **({"data": data} if data else {}))
    return dataclasses.replace(SCALES[name], model=dict(SCALES[name].model), train=train)
