"""Transfer (sections 4.1 and 4.3): two benchmarks under one name, by scale.

- `paper`: Table 5. The released ImageNet-21k weights (`orig_in21k`) fine-tuned on CIFAR-10/100,
  Pets, Flowers and ImageNet by Appendix B.1.1's recipe at 384 px, the learning rate chosen on a
  development split; Table 5's number beside each cell. `rehearsal`: the same path shrunk, the
  weights from a loopback Hub, each dataset a small generated folder.
- `cpu`, `main`, `quick`: Figures 3-4. The data ablation's families pre-trained on Fashion-MNIST's
  classes 0-4 at half its subset sizes, then on classes 5-9 (never seen upstream): the frozen
  features' 5-shot accuracy, and the accuracy after fine-tuning by the paper's recipe shape.
"""

from __future__ import annotations

import dataclasses

import vitzoo
from benchmarks.ablations import data_size
from benchmarks.figures import lines_per_family
from benchmarks.rehearsal_data import FolderSpec
from benchmarks.spec import Ablation, Cell, Scale, difference, report
from benchmarks.training import DATASET_IMAGES, IMAGENET
from benchmarks.transfer_runs import (measure, rehearsal_data, rehearsal_folder, rehearsal_repo,
                                      rehearsal_spec)

# the small scales (Figures 3-4)
UPSTREAM = (0, 1, 2, 3, 4)  # T-shirt, trouser, pullover, dress, coat
DOWNSTREAM = (5, 6, 7, 8, 9)  # sandal, shirt, sneaker, bag, ankle boot: relabelled 0-4
SHARE = len(UPSTREAM) / 10  # of the data ablation's sizes, which are of all ten classes
DOWNSTREAM_IMAGES = {"quick": 128, "main": 1_000, "cpu": 1_000}  # labelled images to transfer to
FINETUNE_STEPS = {"quick": 2, "main": 300, "cpu": 300}
SHOTS = 5

# the paper's scale (Table 4, Appendix B.1.1; Table 5's ImageNet-21k rows)
MODELS = ("vit_b16", "vit_b32", "vit_l16", "vit_l32", "vit_h14")
TAG = "orig_in21k"
# dataset -> fine-tuning steps, the development split's share of the training set (held out to
# pick the learning rate), and Table 5's top-1 % of MODELS in their order
TABLE_5 = {"cifar10": (10_000, 0.02, (98.95, 98.79, 99.16, 99.13, 99.27)),
           "cifar100": (10_000, 0.02, (91.67, 91.97, 93.44, 93.04, 93.82)),
           "oxford-pets": (500, 0.10, (94.43, 93.02, 94.73, 93.09, 94.82)),
           "flowers102": (500, 0.10, (99.38, 99.11, 99.61, 99.19, 99.51)),
           "imagenet": (20_000, 0.01, (83.97, 81.28, 85.15, 80.99, 85.13))}
DATASETS = tuple(TABLE_5)
LRS = {"imagenet": (0.003, 0.01, 0.03, 0.06)}
DEFAULT_LRS = (0.001, 0.003, 0.01, 0.03)
RESOLUTION = 384
# micro-batches of 32: ViT-H/14 at 384 px trains in them on an 80 GB GPU in bf16
FINETUNE = dict(recipe="paper-finetune", batch_size=512, micro_batch=32, num_workers=8,
                random_resized_crop=0.08, hflip=True, checkpoint_every=200)
REHEARSAL_STEPS_DIVISOR = 1000


def label(model: str, dataset: str) -> str:  # a cell of the paper's scales
    return f"{model}.{TAG} {dataset}"


PAPER = {label(m, d): round(row[2][i] / 100, 4) for d, row in TABLE_5.items()
         for i, m in enumerate(MODELS)}


def rehearsal_tags() -> list[str]:
    return [f"{m}.{TAG}" for m in MODELS]


def paper_datasets(scale: Scale) -> dict[str, str]:
    """dataset -> what a run trains on: downloaded, ImageNet the scale's --data (left out where it
    names another), at the rehearsal a generated folder."""
    data = scale.train["data"]
    if scale.name == "rehearsal":
        return {d: data if d == "imagenet" else str(rehearsal_folder(data, d)) for d in DATASETS}
    return {d: (data if d == "imagenet" else d) for d in DATASETS
            if d != "imagenet" or data not in TABLE_5 or data == "imagenet"}


def write_rehearsal_data(scale: Scale, write: bool = True) -> None:
    """The rehearsal's stand-in datasets (`write=False`: planned only)."""
    for name, folder in paper_datasets(scale).items():
        if name != "imagenet":
            rehearsal_data(folder, write=write)


def finetune_cell(scale: Scale, model: str, dataset: str, data: str) -> Cell:
    """The tag fine-tuned on the dataset, after its learning-rate sweep."""
    tag, rehearsal = f"{model}.{TAG}", scale.name == "rehearsal"
    steps, dev_share, _ = TABLE_5[dataset]
    if rehearsal:
        keep = {k: scale.train[k]
                for k in ("batch_size", "micro_batch", "num_workers", "checkpoint_every")}
        train = dict(FINETUNE, **keep, steps=max(4, steps // REHEARSAL_STEPS_DIVISOR),
                     pretrained=f"hf-hub:{rehearsal_repo(tag)}")
        images = (FolderSpec() if dataset == "imagenet" else rehearsal_spec(dataset)).train_images
    else:
        train = dict(FINETUNE, steps=steps, pretrained=tag, download=dataset != "imagenet")
        images = DATASET_IMAGES.get(dataset, IMAGENET)[0]
    train["data"] = data
    patch = vitzoo.get_config(model).patch_size  # H/14 sees 27 x 27 patches of 384 px: 378 px
    lrs = list(LRS.get(dataset, DEFAULT_LRS))
    sweep = {"lrs": [lrs[0], lrs[-1]] if rehearsal else lrs,
             "dev": max(1, round(dev_share * images))}
    # every training of the run, for the plan: the sweep's, then the final one
    more_train = [{**train, "lr": lr, "val_size": sweep["dev"]} for lr in sweep["lrs"]]
    name = f"ViT-{model[4].upper()}/{model[5:]}"
    return Cell(label(model, dataset), {"model": name, "tag": tag, "dataset": dataset},
                {"img_size": RESOLUTION // patch * patch}, train, model=model, inherit=False,
                more={"sweep": sweep, "more_train": more_train})


def cells(scale: Scale) -> list[Cell]:
    """The paper's scales: every tag on every dataset (the rehearsal: each tag and each dataset
    once; the gpu scale's day leaves them to the paper's). The small scales: the data ablation's
    cells on the upstream classes, in proportion to the classes kept, each measured downstream."""
    if scale.name == "gpu":
        return []
    if scale.cells == "paper":
        data = paper_datasets(scale)
        pairs = (zip(MODELS, data) if scale.name == "rehearsal"
                 else [(m, d) for m in MODELS for d in data])
        return [finetune_cell(scale, m, d, data[d]) for m, d in pairs]
    train = scale.train
    finetune = dict(data=train["data"], recipe="paper-finetune", classes=DOWNSTREAM,
                    batch_size=train["batch_size"], steps=FINETUNE_STEPS[scale.name],
                    train_limit=DOWNSTREAM_IMAGES[scale.name], hflip=train.get("hflip", False),
                    **({"test_limit": train["test_limit"]} if train.get("test_limit") else {}))
    more = {"transfer": {"classes": list(DOWNSTREAM), "shots": SHOTS, "finetune": finetune},
            "more_train": [finetune]}  # in the key: the downstream measurement too
    out = []
    for cell in data_size.cells(scale):
        images, family = round(cell.coords["images"] * SHARE), cell.coords["family"]
        train = dict(cell.train, classes=UPSTREAM, train_limit=images,
                     val_size=round(cell.train["val_size"] * SHARE),
                     steps=max(1, round(cell.train["steps"] * SHARE)))
        train["eval_every"] = max(1, train["steps"] // data_size.EVALUATIONS)
        out.append(Cell(f"{family} {images}", {"family": family, "images": images}, cell.options,
                        train, model=cell.model, more=more))
    return out


def small_data(t):
    small = min(r["images"] for r in t.rows)
    return [(f"ResNet - ViT at {small} images", difference(f"ResNet {small}", f"ViT {small}"))]


CLAIMS = (("From little pre-training data ViT transfers worse than the ResNet",
           "Figure 4: ViT-B/32 much worse than ResNet50x1 on 9M JFT images", small_data, ""),
          *data_size.CLAIMS)


def pretraining_compute(t) -> str:
    """The compute note on the pre-training's compute, which the claims are about."""
    return data_size.compute_ratio(t, flops="upstream_flops", compute="pre-training compute")


SMALL_NOTES = (
    "Test accuracy and 5-shot linear are upstream (classes 0-4, the pre-training task, at the "
    "weights of the best validation point); the downstream columns are on classes 5-9, never seen "
    f"in pre-training, from {DOWNSTREAM_IMAGES['cpu']:,} labelled images at the CPU scale: the "
    "5-shot linear accuracy of the frozen features, and the accuracy after fine-tuning by the "
    "paper's recipe shape.")
PAPER_NOTES = (
    "Test accuracy: fine-tuned on the dataset at 384 px by Appendix B.1.1's recipe, at the "
    "learning rate its development split chose (the learning-rate column: its mean over seeds), "
    "trained on the whole training set. The paper's numbers are Table 5's ImageNet-21k rows, the "
    "pre-training of these weights; Table 2's headline rows come from JFT-300M weights, never "
    "released.")


def transfer_report(records: list[dict], out) -> tuple[str, list[dict]]:
    """The standard report with the columns of the scale measured."""
    if any("sweep" in r["config"] for r in records):
        shown = dataclasses.replace(SPEC, figure=None, findings=(), notes=PAPER_NOTES, columns=(
            ("model", "model"), ("tag", "weights"), ("dataset", "dataset"),
            ("lr", "learning rate (dev split)")))
    else:
        shown = dataclasses.replace(SPEC, paper={}, notes=SMALL_NOTES, columns=(
            ("family", "family"), ("images", "pre-training images"), ("params_k", "params"),
            ("best_step", "best step (validation)")))
    return report(shown, records, out)


SPEC = Ablation(
    name="transfer",
    title="Transfer: fine-tuning pre-trained weights (Tables 2, 5) and transfer against "
          "pre-training data (Figures 3-4)",
    cells=cells,
    findings=data_size.findings(CLAIMS, ("transfer_fewshot_5", "transfer_finetune"),
                                pretraining_compute),
    paper=PAPER,
    paper_caption="Table 5, ImageNet-21k pre-training, fine-tuned at 384 px",
    figure=lambda rows, records, out: lines_per_family(
        rows, out / "transfer.png", "Downstream accuracy against pre-training images (Figures 3-4)",
        x_key="images", x_label="pre-training images (classes 0-4; same steps at every size)",
        metrics=(("transfer_fewshot_5", "downstream 5-shot linear"),
                 ("transfer_finetune", "downstream fine-tuned"))),
    measure=measure,
    report=transfer_report,
)
