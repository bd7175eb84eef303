"""Transfer (paper section 4.1, Tables 2 and 5; section 4.3, Figures 3 and 4): fine-tuning pre-trained
weights on other datasets, and how transfer depends on the amount of pre-training data.

Two benchmarks under one name, by scale (`python -m benchmarks transfer`):

- `--scale paper` (and `gpu`, which takes the paper's cells): Tables 2 and 5. The paper's released
  ImageNet-21k weights (the `orig_in21k` tags of ViT-B/16, B/32, L/16, L/32, H/14: the checkpoints of
  Table 5's ImageNet-21k rows) fine-tuned on CIFAR-10, CIFAR-100, Oxford-IIIT Pets, Oxford Flowers-102
  (downloaded through torchvision) and ImageNet (the `--data` folder), by Appendix B.1.1's recipe: SGD
  with momentum 0.9, batch 512, no weight decay, gradient clipping at norm 1, cosine decay, resolution
  384 (position embeddings resampled), a zero-initialised head, Table 4's steps per dataset (ImageNet
  20k, CIFAR 10k, Pets and Flowers 500) and learning rate chosen from its sweep on a development split
  held out of the training set (1% of ImageNet, 2% of CIFAR, 10% of Pets and Flowers), then trained
  on the whole training set at that rate. The table gives Table 5's number beside each cell. Where the
  weights differ from the paper's: Table 2's headline rows were pre-trained on JFT-300M, which was never
  released, and its ViT-L/16 (ImageNet-21k) row was fine-tuned at 512 px; only Table 5's ImageNet-21k
  rows are of these weights (timm's ports, the pre-logits layer dropped, which fine-tuning replaces
  anyway). No finding is judged here: the cells reproduce numbers, not contrasts.
- `--scale rehearsal`: the paper scale's code path with every dimension shrunk: each tag's model
  shrunk as the rehearsal shrinks every model, its weights downloaded from a Hub (`hf-hub:rehearsal/TAG`
  on `HF_ENDPOINT`: the loopback Hub the rehearsal starts, `benchmarks.transfer_runs.serve_weights`),
  each dataset a small generated JPEG folder, the steps divided by 1000.
- `--scale cpu` (and `main`, `quick`): what Figures 3 and 4 are about, transfer after pre-training on
  more data, on a 2-core CPU. The data ablation's three models (a BiT ResNet, the CPU scale's ViT, a
  hybrid; `benchmarks.ablations.data_size`) pre-trained on Fashion-MNIST's classes 0-4 only, at the
  data ablation's subset sizes in proportion to the classes kept (half: 500, 3,750 and 27,500 images,
  with half its validation split, 2,500; together all 30,000 training images of those classes), each
  family for the same steps at every size with early stopping, the ResNet for half the ViT's (its
  training compute), as there. Then, on classes 5-9 (relabelled 0-4; never
  seen upstream), from 1,000 labelled training images: (a) the 5-shot linear accuracy of the frozen
  pre-logits features (Figure 4's metric) and (b) the accuracy after fine-tuning by the paper's recipe
  shape (SGD momentum 0.9, no weight decay, clipping at 1, cosine decay, zero-initialised head, lr 0.01:
  the recipe's; the scale's batch of 128, 300 steps), both on the 5,000 test images of classes 5-9.

Findings at the small scales, each judged on both downstream metrics by the one rule
(`benchmarks.verdict`): from little pre-training data the ViT transfers worse than the ResNet (Figure
4: ViT-B/32 much worse than ResNet50x1 on the 9M JFT subset), and the data ablation's claims
(`data_size.CLAIMS`) on transfer: the ResNet's lead shrinks as pre-training data grows, with enough data
ViT overtakes it, ResNets plateau sooner. No claim of no difference is judged: section 4.3 states none
about these families (its "with ImageNet-21k pre-training, their performances are similar" compares
ViT-L with ViT-B). The hybrids are measured and shown; the paper states nothing about their transfer
against pre-training data (Figure 5 is about compute).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import vitzoo
from benchmarks.ablations import data_size
from benchmarks.figures import lines_per_family
from benchmarks.rehearsal_data import FolderSpec
from benchmarks.spec import Ablation, Cell, Finding, Scale, Table, difference, report
from benchmarks.suite import Run
from benchmarks.transfer_runs import measure, rehearsal_data, rehearsal_folder, rehearsal_repo, rehearsal_spec
from benchmarks.verdict import POSITIVE

# ------------------------------------------------------------------------- the small scales (Figures 3-4)
UPSTREAM = (0, 1, 2, 3, 4)  # Fashion-MNIST's T-shirt, trouser, pullover, dress, coat
DOWNSTREAM = (5, 6, 7, 8, 9)  # sandal, shirt, sneaker, bag, ankle boot: relabelled 0-4
SHARE = len(UPSTREAM) / 10  # of the data ablation's sizes: its subsets are of all ten classes
DOWNSTREAM_IMAGES = {"quick": 128, "main": 1_000, "cpu": 1_000}  # labelled images to transfer to
FINETUNE_STEPS = {"quick": 2, "main": 300, "cpu": 300}
SHOTS = 5


def downstream_finetune(scale: Scale) -> dict:
    """The fine-tuning of the small scales: the paper's recipe shape (`paper-finetune`: SGD momentum 0.9,
    no weight decay, clipping at 1, cosine decay, a zero-initialised head, lr 0.01) at the scale's batch
    and data, on the downstream classes."""
    train = scale.train
    return dict(data=train["data"], recipe="paper-finetune", classes=DOWNSTREAM, batch_size=train["batch_size"],
                steps=FINETUNE_STEPS[scale.name], train_limit=DOWNSTREAM_IMAGES[scale.name],
                hflip=train.get("hflip", False), **({"test_limit": train["test_limit"]} if train.get("test_limit") else {}))


def upstream_cells(scale: Scale) -> list[Cell]:
    """The data ablation's cells, on the upstream classes: its subset sizes, validation split and steps
    (each family's: the ResNet's at the ViT's compute) in proportion to the classes kept."""
    out = []
    # the ResNet at the ViT's training compute, in half its steps, as in the data ablation (its runs at
    # the same steps as the ViT, twice its compute, are archived with why)
    for cell in data_size.cells(scale):
        images = round(cell.coords["images"] * SHARE)
        train = dict(cell.train, classes=UPSTREAM, train_limit=images, val_size=round(cell.train["val_size"] * SHARE),
                     steps=max(1, round(cell.train["steps"] * SHARE)))
        train["eval_every"] = max(1, train["steps"] // data_size.EVALUATIONS)
        family = cell.coords["family"]
        out.append(Cell(f"{family} {images}", {"family": family, "images": images}, cell.options, train, model=cell.model))
    return out


# ------------------------------------------------------------------------- the paper's scale (Tables 2, 5)
MODELS = ("vit_b16", "vit_b32", "vit_l16", "vit_l32", "vit_h14")  # Table 5's columns
PAPER_NAMES = {"vit_b16": "ViT-B/16", "vit_b32": "ViT-B/32", "vit_l16": "ViT-L/16", "vit_l32": "ViT-L/32", "vit_h14": "ViT-H/14"}
TAG = "orig_in21k"  # the paper's ImageNet-21k checkpoints
DATASETS = ("cifar10", "cifar100", "oxford-pets", "flowers102", "imagenet")
# Table 4 / Appendix B.1.1: steps and the learning-rate sweep per dataset; the development split
# (Appendix B.1.1: "small sub-splits from the training set ... as development set")
STEPS = {"imagenet": 20_000, "cifar10": 10_000, "cifar100": 10_000, "oxford-pets": 500, "flowers102": 500}
LRS = {"imagenet": (0.003, 0.01, 0.03, 0.06)}
DEFAULT_LRS = (0.001, 0.003, 0.01, 0.03)
DEV_SHARE = {"imagenet": 0.01, "cifar10": 0.02, "cifar100": 0.02, "oxford-pets": 0.10, "flowers102": 0.10}
TRAIN_IMAGES = {"imagenet": 1_281_167, "cifar10": 50_000, "cifar100": 50_000, "oxford-pets": 3_680, "flowers102": 2_040}
RESOLUTION = 384
# Micro-batches of 32 (the global batch of 512 accumulated): ViT-H/14 at 384 px trains in them on an
# 80 GB GPU in bf16; JPEGs decoded by 8 loader workers; a checkpoint every 200 steps.
FINETUNE = dict(recipe="paper-finetune", batch_size=512, micro_batch=32, num_workers=8, random_resized_crop=0.08,
                hflip=True, checkpoint_every=200)
REHEARSAL_STEPS_DIVISOR = 1000

# Table 5, ImageNet-21k pre-training, fine-tuned at 384 px (top-1 %; ImageNet's also in vitzoo.zoo). Transcribed
# from the paper (arXiv 2010.11929v2), not from shared/reference/vit-paper.md, which has the ImageNet column only.
TABLE_5_IN21K = {
    "cifar10": {"vit_b16": 98.95, "vit_b32": 98.79, "vit_l16": 99.16, "vit_l32": 99.13, "vit_h14": 99.27},
    "cifar100": {"vit_b16": 91.67, "vit_b32": 91.97, "vit_l16": 93.44, "vit_l32": 93.04, "vit_h14": 93.82},
    "imagenet": {"vit_b16": 83.97, "vit_b32": 81.28, "vit_l16": 85.15, "vit_l32": 80.99, "vit_h14": 85.13},
    "flowers102": {"vit_b16": 99.38, "vit_b32": 99.11, "vit_l16": 99.61, "vit_l32": 99.19, "vit_h14": 99.51},
    "oxford-pets": {"vit_b16": 94.43, "vit_b32": 93.02, "vit_l16": 94.73, "vit_l32": 93.09, "vit_h14": 94.82},
}


def tag_of(model: str) -> str:
    return f"{model}.{TAG}"


def rehearsal_tags() -> list[str]:
    """The tags whose stand-in weights the rehearsal serves."""
    return [tag_of(m) for m in MODELS]


def label(model: str, dataset: str) -> str:
    return f"{tag_of(model)} {dataset}"


def paper_datasets(scale: Scale) -> dict[str, str]:
    """dataset -> what a run trains on: the named datasets (downloaded), ImageNet from the scale's data
    (its --data folder; left out where --data names one of the others); at the rehearsal, a small
    generated folder for each (ImageNet's is the rehearsal's own)."""
    data = scale.train["data"]
    if scale.name == "rehearsal":
        return {name: data if name == "imagenet" else str(rehearsal_folder(data, name)) for name in DATASETS}
    return {name: (data if name == "imagenet" else name) for name in DATASETS
            if name != "imagenet" or data not in TRAIN_IMAGES or data == "imagenet"}


def write_rehearsal_data(scale: Scale, write: bool = True) -> None:
    """The rehearsal's generated stand-in for each dataset, written once (before the plan counts its images);
    `write=False` (a dry run): planned only."""
    for name, folder in paper_datasets(scale).items():
        if name != "imagenet":
            rehearsal_data(folder, write=write)


def finetune_run(scale: Scale, model: str, dataset: str, data: str, seed: int) -> Run:
    """One cell and seed at the paper's scales: the tag fine-tuned on the dataset, after its sweep."""
    if scale.name == "rehearsal":
        keep = ("batch_size", "micro_batch", "num_workers", "checkpoint_every")
        train = dict(FINETUNE, **{k: scale.train[k] for k in keep}, steps=max(4, STEPS[dataset] // REHEARSAL_STEPS_DIVISOR),
                     pretrained=f"hf-hub:{rehearsal_repo(tag_of(model))}")
        images = (FolderSpec() if dataset == "imagenet" else rehearsal_spec(dataset)).train_images
    else:
        train = dict(FINETUNE, steps=STEPS[dataset], pretrained=tag_of(model), download=dataset != "imagenet")
        images = TRAIN_IMAGES[dataset]
    train["data"] = data
    # H/14: the official patch convolution (VALID padding) sees 27 x 27 patches of 384 px, i.e. 378 px
    options = {"img_size": RESOLUTION // vitzoo.get_config(model).patch_size * vitzoo.get_config(model).patch_size}
    if scale.shrink is not None:
        options = scale.shrink(model, options)
    lrs = list(LRS.get(dataset, DEFAULT_LRS))
    if scale.name == "rehearsal":  # the sweep shrunk too: its lowest and highest rate choose as four do
        lrs = [lrs[0], lrs[-1]]
    sweep = {"lrs": lrs, "dev": max(1, round(DEV_SHARE[dataset] * images))}
    config = {"model": model, "options": options, "train": train, "sweep": sweep,
              # every training of the run, for the plan: the sweep's, then the final one
              "more_train": [{**train, "lr": lr, "val_size": sweep["dev"]} for lr in sweep["lrs"]]}
    coords = {"model": PAPER_NAMES[model], "tag": tag_of(model), "dataset": dataset}
    return Run("transfer", label(model, dataset), config, seed, coords)


def paper_cells(scale: Scale) -> list[tuple[str, str]]:
    """(model, dataset) of the paper's scales: every tag on every dataset (Table 5). The rehearsal takes
    each tag once and each dataset once (B/16 on CIFAR-10, B/32 on CIFAR-100, ..., H/14 on ImageNet): the
    code path of a tag or a dataset does not depend on what it is paired with, and the other twenty pairs
    (each five two-process trainings, its sweep's and the final one) would only repeat it."""
    datasets = list(paper_datasets(scale))
    if scale.name == "rehearsal":
        return list(zip(MODELS, datasets))
    return [(m, d) for m in MODELS for d in datasets]


# ------------------------------------------------------------------------- the spec
def cells(scale: Scale) -> list[Cell]:
    """The upstream cells at the small scales (the paper's runs are built by `TransferAblation.runs`)."""
    if scale.cells == "paper":
        return [Cell(label(m, d), {"model": PAPER_NAMES[m], "dataset": d}) for m, d in paper_cells(scale)]
    return upstream_cells(scale)


class TransferAblation(Ablation):
    """The runs of both benchmarks: at the small scales, each upstream cell with its downstream
    measurements (`transfer` in the config, hashed into the key); at the paper's, each tag and dataset
    with its fine-tuning and sweep, none of the scale's pre-training settings inherited."""

    def runs(self, scale: Scale) -> list[Run]:
        seeds = scale.seeds
        if scale.name == "gpu":  # fine-tuning the released weights is the paper scale's (3,400 GPU-hours at
            return []            # 125 TFLOP/s): the gpu scale's day on one node is the ablations'
        if scale.cells == "paper":
            data = paper_datasets(scale)
            return [finetune_run(scale, m, d, data[d], seed) for m, d in paper_cells(scale) for seed in range(seeds)]
        finetune = downstream_finetune(scale)
        transfer = {"classes": list(DOWNSTREAM), "shots": SHOTS, "finetune": finetune}
        out = []
        for run in Ablation.runs(self, scale):
            config = {**run.config, "transfer": transfer, "more_train": [finetune]}
            out.append(Run(run.ablation, run.label, config, run.seed, run.group))
        return out


def _present(t: Table) -> bool:
    return bool(t.where(family="ResNet")) and bool(t.where(family="ViT"))


def _small_data(t: Table):
    small = min(r["images"] for r in t.rows)
    return [(f"ResNet - ViT at {small} images", difference(f"ResNet {small}", f"ViT {small}"))]


CLAIMS = (("From little pre-training data ViT transfers worse than the ResNet",
           "Figure 4: ViT-B/32 much worse than ResNet50x1 on 9M JFT images", _small_data, ""),) + data_size.CLAIMS
METRICS = ("transfer_fewshot_5", "transfer_finetune")


def pretraining_compute(t: Table) -> str:
    """The compute note on the pre-training's compute, which the claims are about; the downstream fine-tuning,
    the same 300 steps for every family, is the measurement (it costs the ResNet twice the ViT's per image)."""
    return data_size.compute_ratio(t, flops="upstream_flops", compute="pre-training compute")


FINDINGS = tuple(
    Finding(claim, paper, POSITIVE, lambda t, contrasts=contrasts: contrasts(t) if _present(t) else [], metric=metric,
            regime=regime, note=pretraining_compute)
    for claim, paper, contrasts, regime in CLAIMS for metric in METRICS
)
PAPER = {label(m, d): round(TABLE_5_IN21K[d][m] / 100, 4) for m in MODELS for d in DATASETS}


def figure(rows: list[dict], records: list[dict], out: Path) -> list[str]:
    lines_per_family(rows, "family", out / "transfer.png", "Downstream accuracy against pre-training images (Figures 3-4)",
                     x_key="images", x_label="pre-training images (classes 0-4; same steps at every size)",
                     metrics=(("transfer_fewshot_5", "downstream 5-shot linear"), ("transfer_finetune", "downstream fine-tuned")))
    return ["transfer.png"]


SMALL_NOTES = ("Test accuracy and 5-shot linear are upstream (classes 0-4, the pre-training task, at the weights of the "
               "best validation point); the downstream columns are on classes 5-9, never seen in pre-training, from "
               f"{DOWNSTREAM_IMAGES['cpu']:,} labelled images at the CPU scale: the 5-shot linear accuracy of the frozen "
               "features, and the accuracy after fine-tuning by the paper's recipe shape.")
PAPER_NOTES = ("Test accuracy: fine-tuned on the dataset at 384 px by Appendix B.1.1's recipe, at the learning rate its "
               "development split chose (the learning-rate column: its mean over seeds), trained on the whole training "
               "set. The paper's numbers are Table 5's ImageNet-21k rows, the pre-training of these weights; Table 2's "
               "headline rows come from JFT-300M weights, never released.")


def transfer_report(records: list[dict], out: Path) -> tuple[str, list[dict]]:
    """The standard table and verdicts (`benchmarks.spec.report`), with the columns of the scale measured:
    the small scales' families and sizes, or the paper's tags and datasets with Table 5 beside."""
    if any("sweep" in r["config"] for r in records):
        shown = dataclasses.replace(SPEC, report=None, figure=None, findings=(), notes=PAPER_NOTES,
                                    columns=(("model", "model"), ("tag", "weights"), ("dataset", "dataset"),
                                             ("lr", "learning rate (dev split)")))
    else:
        shown = dataclasses.replace(SPEC, report=None, paper={}, notes=SMALL_NOTES,
                                    columns=(("family", "family"), ("images", "pre-training images"), ("params_k", "params"),
                                             ("best_step", "best step (validation)")))
    return report(shown, records, out)


SPEC = TransferAblation(
    name="transfer",
    title="Transfer: fine-tuning pre-trained weights (Tables 2, 5) and transfer against pre-training data (Figures 3-4)",
    cells=cells,
    findings=FINDINGS,
    paper=PAPER,
    paper_caption="Table 5, ImageNet-21k pre-training, fine-tuned at 384 px",
    figure=figure,
    measure=measure,
    report=transfer_report,
)
