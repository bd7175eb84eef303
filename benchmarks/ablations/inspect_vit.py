"""Inspecting trained models (section 4.5): mean attention distance per head against depth
(Figure 11), position-embedding similarity and the patch filters' principal components (Figure 7),
attention rollout (Figure 6), drawn with `vitzoo.analysis`. The ablation `inspect`."""

from __future__ import annotations

import torch
from torch.nn.functional import interpolate

from benchmarks.figures import plt, save
from benchmarks.spec import Ablation, Cell, Finding
from benchmarks.training import evaluate_per_epoch, train
from vitzoo.analysis import (attention_rollout, mean_attention_distance, patch_embedding_components,
                             position_embedding_similarity)
from vitzoo.data import build_transform, load_split

TRAINED_LONGER = 2  # times the scale's epochs: the analyses are of trained models
GRID = 8  # the token grid Figure 11's local and global heads need: half of ViT-L/16's 14 x 14


def cells(scale) -> list[Cell]:
    if scale.cells == "paper":
        return [Cell("ViT", {"family": "ViT"}, model="vit_b16"),
                Cell("hybrid", {"family": "hybrid"}, model="vit_b16_hybrid")]
    longer = {} if scale.name == "quick" else {"epochs": scale.train["epochs"] * TRAINED_LONGER}
    train = evaluate_per_epoch({**scale.train, **longer})  # where the test accuracy levels off
    hybrid = {"stem": "resnet", "stem_options": {"layers": ()}, "patch_size": 1}  # the ResNet root
    return [Cell("ViT", {"family": "ViT"}, train=train),
            Cell("hybrid", {"family": "hybrid"}, hybrid, train)]


def uniform_attention_distance(img_size: list[int], stride: list[int]) -> float:
    """Mean pixel distance between patch centres: a head attending to every patch alike."""
    rows, cols = img_size[0] // stride[0], img_size[1] // stride[1]
    ys, xs = torch.meshgrid(torch.arange(rows) * stride[0], torch.arange(cols) * stride[1],
                            indexing="ij")
    centres = torch.stack([ys.flatten(), xs.flatten()], dim=1).double()
    return float(torch.cdist(centres, centres).mean())


def measure(run, device: str, out) -> dict:
    """Train, then analyse the trained model on test images; the arrays go into the result, with
    Figure 11's numbers: the first and last layer's mean distance and spread over heads."""
    model, result = train(run, device, out)
    model, cfg = model.eval().cpu(), model.config
    test = load_split(run.config["train"]["data"], "test", run.config["train"].get("data_dir"),
                      img_size=cfg.img_size, in_chans=cfg.in_chans)
    resize = build_transform(cfg.img_size, None)  # image folders hold any size
    images = torch.stack([resize(test[i][0]) for i in range(min(64, len(test)))]).float() / 255
    mean, std = torch.tensor(cfg.mean).view(1, -1, 1, 1), torch.tensor(cfg.std).view(1, -1, 1, 1)
    x = (images - mean) / std
    analyses = {"attention_distance": mean_attention_distance(model, x).tolist(),
                "rollout": attention_rollout(model, x[:4]).tolist(),
                "rollout_images": images[:4].tolist(), "stride": list(model.stride),
                "img_size": list(cfg.img_size)}
    if cfg.stem == "patch":
        components, explained = patch_embedding_components(model, k=28)
        analyses.update(pos_similarity=position_embedding_similarity(model).tolist(),
                        filter_components=components.tolist(), filter_explained=explained.tolist())
    distance = torch.tensor(analyses["attention_distance"])  # layers x heads
    first, last = distance[0], distance[-1]
    summary = {"first_mean_px": first.mean(), "last_mean_px": last.mean(),
               "first_spread_px": first.max() - first.min(),
               "last_spread_px": last.max() - last.min()}
    metrics = result["metrics"]
    metrics.update({k: round(float(v), 2) for k, v in summary.items()}, analyses=analyses,
                   uniform_px=uniform_attention_distance(cfg.img_size, model.stride))
    metrics["growth_px"] = round(metrics["last_mean_px"] - metrics["first_mean_px"], 2)
    metrics["spread_drop_px"] = round(metrics["first_spread_px"] - metrics["last_spread_px"], 2)
    curve = metrics["curve"]  # test accuracy after each epoch: how far from levelling off
    if len(curve) >= 2:
        metrics["last_epoch_gain"] = curve[-1]["test_acc"] - curve[-2]["test_acc"]
    return result


def grid_too_coarse(t) -> str:
    """Why the ViT's distances cannot show Figure 11 here: its token grid (with how far its heads
    lie from uniform attention, for the reader)."""
    analyses = [r["metrics"]["analyses"] for r in t.records.get("ViT", [])
                if "analyses" in r["metrics"]]
    if not analyses:
        return ""
    side = min(a["img_size"][0] // a["stride"][0] for a in analyses)
    if side >= GRID:
        return ""
    uniform = uniform_attention_distance(analyses[0]["img_size"], analyses[0]["stride"])
    off = max(abs(d - uniform) for a in analyses for layer in a["attention_distance"]
              for d in layer)
    return (f"the ViT sees a {side} x {side} grid of tokens, under the {GRID} x {GRID} that Figure "
            f"11's local and global heads need (its 14 x 14); every head of every seed lies within "
            f"{off:.2f} px of uniform attention's {uniform:.2f} px, so no head is local or global "
            "here")


def figure(rows, records, out) -> list[str]:
    """Figure 11 of every seed; the other figures of the first seed's models."""
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(5, 3.5))
    for i, row in enumerate(rows):
        for j, r in enumerate(x for x in records if x["label"] == row["label"]):
            distance = torch.tensor(r["metrics"]["analyses"]["attention_distance"])  # layers, heads
            for head in range(distance.shape[1]):
                ax.scatter(range(1, distance.shape[0] + 1), distance[:, head].numpy(),
                           color=f"C{i}", s=10, alpha=0.6,
                           label=row["label"] if head == 0 and j == 0 else None)
    ax.axhline(records[0]["metrics"]["uniform_px"], color="gray", linestyle=":",
               label="uniform attention")
    ax.set(xlabel="network depth (layer)", ylabel="mean attention distance (pixels)",
           title="Mean attention distance (Figure 11), every seed")
    ax.legend(fontsize=7)
    files = save(fig, out / "attention_distance.png")
    first_seed = [r for r in records if r["seed"] == min(x["seed"] for x in records)]
    vit = next((a for r in first_seed if "pos_similarity" in (a := r["metrics"]["analyses"])), None)
    if vit is not None:
        sim = torch.tensor(vit["pos_similarity"])  # h, w, h, w
        h, w = sim.shape[:2]
        fig, axes = pyplot.subplots(h, w, figsize=(w * 0.8, h * 0.8))
        for ax, similarity in zip(axes.flat, sim.flatten(0, 1)):
            ax.imshow(similarity.numpy(), vmin=-1, vmax=1, cmap="viridis")
            ax.axis("off")
        fig.suptitle("Position embedding similarity (Figure 7, centre)", fontsize=9)
        files += save(fig, out / "pos_embed_similarity.png")
        fig, axes = pyplot.subplots(4, 7, figsize=(7, 4))
        for ax, comp in zip(axes.flat, torch.tensor(vit["filter_components"])):  # k, C, P, P
            image = comp.mean(0) if comp.shape[0] != 3 else comp.permute(1, 2, 0)
            image = (image - image.min()) / (image.max() - image.min() + 1e-8)
            ax.imshow(image.numpy(), cmap="gray")
        for ax in axes.flat:
            ax.axis("off")
        fig.suptitle("Principal components of the patch-embedding filters (Figure 7, left)",
                     fontsize=9)
        files += save(fig, out / "patch_filters.png")
    fig, axes = pyplot.subplots(len(first_seed), 8, figsize=(12, 1.8 * len(first_seed)),
                                squeeze=False)
    for row, r in zip(axes, first_seed):
        a = r["metrics"]["analyses"]
        images, maps = torch.tensor(a["rollout_images"]), torch.tensor(a["rollout"])
        for k in range(4):
            image = images[k].mean(0)
            up = interpolate(maps[k][None, None], size=image.shape, mode="bilinear")[0, 0]
            row[2 * k].imshow(image.numpy(), cmap="gray")
            row[2 * k + 1].imshow((image * up).numpy(), cmap="gray")
            row[2 * k].set_title(r["label"] if k == 0 else "", fontsize=8)
        for ax in row:
            ax.axis("off")
    fig.suptitle("Attention rollout: input and attended (Figure 6)", fontsize=9)
    return files + save(fig, out / "attention_rollout.png")


def vit_contrast(name: str):
    return lambda t: [(name, {"ViT": 1.0})] if "ViT" in t.by_label else []


SPEC = Ablation(
    name="inspect",
    title="Inside trained models (section 4.5, Figures 6, 7, 11)",
    cells=cells,
    findings=(
        Finding("ViT: heads in the lowest layer attend at widely different distances, deeper "
                "ones alike", "Figure 11: layer 1 spans ~10-120 px, the last layers ~120 px",
                vit_contrast("spread over heads, layer 1 - last layer (px)"),
                metric="spread_drop_px", untestable=grid_too_coarse),
        Finding("ViT: the attention distance grows with depth", "Figure 11",
                vit_contrast("mean distance, last layer - layer 1 (px)"), metric="growth_px",
                untestable=grid_too_coarse),
    ),
    columns=(("family", "model"), ("first_mean_px", "layer 1 mean (px)"),
             ("first_spread_px", "layer 1 spread (px)"), ("last_mean_px", "last layer mean (px)"),
             ("last_spread_px", "last layer spread (px)"), ("uniform_px", "uniform attention (px)"),
             ("last_epoch_gain", "test accuracy gained in the last epoch")),
    figure=figure,
    measure=measure,
)
