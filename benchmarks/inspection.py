"""Inspecting trained models (paper section 4.5): mean attention distance per head against depth
(Figure 11), cosine similarity of position embeddings (Figure 7 centre), principal components of the
patch-embedding filters (Figure 7 left), and attention rollout on test images (Figure 6)."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.common import plt, save_figure
from benchmarks.suite import Run, markdown_table
from benchmarks.training import scale_settings, train
from vitzoo.data import load_split
from vitzoo.inspect import attention_rollout, mean_attention_distance, patch_embedding_components, position_embedding_similarity

NAME = "inspect"


def plan(scale: str, quick: bool, data=None, data_dir=None) -> list[Run]:
    model, train = scale_settings(scale, quick, data, data_dir)
    name = "vit_b16" if scale == "paper" and not quick else "vit_ti16"
    hybrid = {**model, "stem": "resnet", "resnet_layers": (1,), "patch_size": 1}
    if scale == "paper" and not quick:
        hybrid = {}
    return [
        Run(NAME, "ViT", {"model": name, "options": model, "train": train}, 0, {"family": "ViT"}),
        Run(NAME, "hybrid", {"model": "vit_b16_hybrid" if scale == "paper" and not quick else name, "options": hybrid, "train": train},
            0, {"family": "hybrid"}),
    ]


def uniform_attention_distance(img_size: list[int], stride: list[int]) -> float:
    """Mean pixel distance between patch centres: the attention distance of a head that attends to
    every patch alike (the yardstick for "local" and "global" heads)."""
    rows, cols = img_size[0] // stride[0], img_size[1] // stride[1]
    ys, xs = torch.meshgrid(torch.arange(rows) * stride[0], torch.arange(cols) * stride[1], indexing="ij")
    centres = torch.stack([ys.flatten(), xs.flatten()], dim=1).double()
    return float(torch.cdist(centres, centres).mean())


def measure(run: Run, device: str) -> dict:
    """Train, then measure the trained model; the analyses' arrays are stored in the result."""
    model, result = train(run, device)
    model = model.eval().cpu()
    cfg = model.config
    test = load_split(run.config["train"]["data"], "test", run.config["train"].get("data_dir"),
                      img_size=cfg.img_size, in_chans=cfg.in_chans)
    images = torch.stack([test[i][0] for i in range(64)]).float() / 255
    mean, std = torch.tensor(cfg.mean).view(1, -1, 1, 1), torch.tensor(cfg.std).view(1, -1, 1, 1)
    x = (images - mean) / std
    analyses = {"attention_distance": mean_attention_distance(model, x).tolist(),
                "rollout": attention_rollout(model, x[:4]).tolist(), "rollout_images": images[:4].tolist(),
                "stride": list(model.stride), "img_size": list(cfg.img_size)}
    if cfg.stem == "patch":
        components, explained = patch_embedding_components(model, k=28)
        analyses.update(pos_similarity=position_embedding_similarity(model).tolist(),
                        filter_components=components.tolist(), filter_explained=explained.tolist())
    result["metrics"]["analyses"] = analyses
    return result


def report(records: list[dict], out: Path) -> str:
    pyplot = plt()
    rows = []
    fig, ax = pyplot.subplots(figsize=(5, 3.5))
    for i, r in enumerate(records):
        distance = torch.tensor(r["metrics"]["analyses"]["attention_distance"])  # layers x heads
        for head in range(distance.shape[1]):
            ax.scatter(range(1, distance.shape[0] + 1), distance[:, head].numpy(), color=f"C{i}", s=12,
                       label=r["label"] if head == 0 else None)
        rows.append([r["label"], f"{r['metrics']['test_acc']:.4f}",
                     " / ".join(f"{distance[l].min():.1f}-{distance[l].max():.1f}" for l in range(distance.shape[0]))])
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_title("Mean attention distance (Figure 11)")
    ax.legend()
    save_figure(fig, out / "attention_distance.png")
    pyplot.close(fig)
    vit = next((r for r in records if "pos_similarity" in r["metrics"]["analyses"]), None)
    if vit is not None:
        figure_position_similarity(vit, out / "pos_embed_similarity.png")
        figure_filters(vit, out / "patch_filters.png")
    figure_rollout(records, out / "attention_rollout.png")
    findings = []
    for r in records:
        analyses = r["metrics"]["analyses"]
        d = torch.tensor(analyses["attention_distance"])
        first, last = d[0], d[-1]
        uniform = uniform_attention_distance(analyses["img_size"], analyses["stride"])
        # "widely different": the paper's lowest layers span ~10-120 px; here the spread must reach half
        # the layer's mean. "grows": the last layer's mean at least 10% above the first's.
        wide = float(first.max() - first.min()) >= 0.5 * float(first.mean())
        grows = float(last.mean()) >= 1.1 * float(first.mean())
        findings.append(
            f"- {r['label']}: *heads in the lowest layer attend at widely different distances* (paper): "
            f"{'**reproduced**' if wide else '**not reproduced**'}: layer 1 spans {first.min():.1f}-{first.max():.1f} px "
            f"(mean {first.mean():.1f} px; attention spread evenly over the image would give {uniform:.1f} px).")
        findings.append(
            f"- {r['label']}: *the attention distance grows with depth* (paper): "
            f"{'**reproduced**' if grows else '**not reproduced**'}: mean {first.mean():.1f} px in layer 1, "
            f"{last.mean():.1f} px in layer {d.shape[0]}.")
    return (markdown_table(["model", "test accuracy", "attention distance per layer (min-max over heads, px)"], rows)
            + "\n\n" + "\n".join(findings)
            + "\n\nFigures: `attention_distance.png`, `pos_embed_similarity.png`, `patch_filters.png`, `attention_rollout.png`.")


def figure_position_similarity(record: dict, path: Path) -> None:
    pyplot = plt()
    sim = torch.tensor(record["metrics"]["analyses"]["pos_similarity"])  # h, w, h, w
    h, w = sim.shape[:2]
    fig, axes = pyplot.subplots(h, w, figsize=(w * 0.8, h * 0.8))
    for i in range(h):
        for j in range(w):
            axes[i][j].imshow(sim[i, j].numpy(), vmin=-1, vmax=1, cmap="viridis")
            axes[i][j].axis("off")
    fig.suptitle("Position embedding similarity (Figure 7, centre)", fontsize=9)
    save_figure(fig, path)
    pyplot.close(fig)


def figure_filters(record: dict, path: Path) -> None:
    pyplot = plt()
    comps = torch.tensor(record["metrics"]["analyses"]["filter_components"])  # k, C, P, P
    fig, axes = pyplot.subplots(4, 7, figsize=(7, 4))
    for ax, comp in zip(axes.flat, comps):
        image = comp.mean(0) if comp.shape[0] != 3 else comp.permute(1, 2, 0)
        image = (image - image.min()) / (image.max() - image.min() + 1e-8)
        ax.imshow(image.numpy(), cmap="gray")
    for ax in axes.flat:
        ax.axis("off")
    fig.suptitle("Principal components of the patch-embedding filters (Figure 7, left)", fontsize=9)
    save_figure(fig, path)
    pyplot.close(fig)


def figure_rollout(records: list[dict], path: Path) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(len(records), 8, figsize=(12, 1.8 * len(records)), squeeze=False)
    for row, r in zip(axes, records):
        a = r["metrics"]["analyses"]
        images, maps = torch.tensor(a["rollout_images"]), torch.tensor(a["rollout"])
        for k in range(4):
            image = images[k].mean(0)
            up = torch.nn.functional.interpolate(maps[k][None, None], size=image.shape, mode="bilinear")[0, 0]
            row[2 * k].imshow(image.numpy(), cmap="gray")
            row[2 * k + 1].imshow((image * up).numpy(), cmap="gray")
            row[2 * k].set_title(r["label"] if k == 0 else "", fontsize=8)
        for ax in row:
            ax.axis("off")
    fig.suptitle("Attention rollout: input and attended (Figure 6)", fontsize=9)
    save_figure(fig, path)
    pyplot.close(fig)
