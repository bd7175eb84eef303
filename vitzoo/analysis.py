"""Looking inside a trained ViT (paper section 4.5, Figures 6, 7 and 11).

- `mean_attention_distance`: per layer and head, the attention-weighted distance in pixels between a
  query patch and the patches it attends to, averaged over queries and images (Figure 11, D.7).
- `attention_rollout`: Abnar & Zuidema's rollout: average the heads, add the identity for the
  residual connection, renormalise, multiply through the layers (Figure 6, D.8).
- `position_embedding_similarity`: cosine similarity of each patch's position embedding with all
  others (Figure 7, centre).
- `patch_embedding_components`: principal components of the patch-embedding filters (Figure 7,
  left).
"""

from __future__ import annotations

import torch

from vitzoo.model import VisionTransformer


def _patch_centres(model: VisionTransformer, grid: tuple[int, int]) -> torch.Tensor:
    """(N, 2) pixel coordinates of the patch centres, row-major."""
    (sh, sw), (h, w) = model.stride, grid
    ys = (torch.arange(h, dtype=torch.float32) + 0.5) * sh
    xs = (torch.arange(w, dtype=torch.float32) + 0.5) * sw
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2)


@torch.no_grad()
def mean_attention_distance(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """(layers, heads) mean attention distance in pixels, over patch queries and patch keys.

    The class token has no position: its row and column are left out and the remaining attention
    of each query renormalised to sum to one.
    """
    model.eval()
    maps = model.get_attention_maps(images)
    grid = model.grid_size(tuple(images.shape[-2:]))
    centres = _patch_centres(model, grid).to(maps[0].device)  # where the attention maps are
    distance = torch.cdist(centres, centres)  # (N, N) pixels
    p = model.num_prefix_tokens
    out = []
    for attn in maps:  # (B, H, T, T)
        patches = attn[:, :, p:, p:].float()
        patches = patches / patches.sum(-1, keepdim=True)
        out.append((patches * distance).sum(-1).mean(dim=(0, 2)))  # mean over images and queries
    return torch.stack(out)


@torch.no_grad()
def attention_rollout(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """(B, h, w) attention of the output representation to each patch, rolled out through layers.

    With a class token the map is the class token's row; without one (GAP) it is the mean row over
    all tokens, which is what the pooled representation sees.
    """
    model.eval()
    maps = model.get_attention_maps(images)
    tokens = maps[0].shape[-1]
    identity = torch.eye(tokens, device=images.device)
    rollout = identity.expand(images.shape[0], tokens, tokens)
    for attn in maps:
        a = attn.float().mean(dim=1) + identity  # heads averaged, residual added
        a = a / a.sum(dim=-1, keepdim=True)
        rollout = a @ rollout
    p = model.num_prefix_tokens
    rows = rollout[:, 0, p:] if p else rollout[:, :, p:].mean(dim=1)
    grid = model.grid_size(tuple(images.shape[-2:]))
    rows = rows / rows.amax(dim=-1, keepdim=True)
    return rows.reshape(-1, *grid)


@torch.no_grad()
def position_embedding_similarity(model: VisionTransformer) -> torch.Tensor:
    """(h, w, h, w): cosine similarity of the position embedding of patch (i, j) with patch (k, l).

    Uses the embedding added at the input (the first one for `every_layer`); only additive
    embeddings have per-patch vectors to compare.
    """
    modules = model.encoder.position_embeddings()
    if not modules or getattr(modules[0], "in_attention", False):
        raise ValueError(f"pos_embed={model.config.pos_embed!r} has no per-patch embedding vectors "
                         "to compare")
    grid, p = model.grid, model.num_prefix_tokens
    zeros = torch.zeros(1, p + grid[0] * grid[1], model.config.embed_dim,
                        device=next(model.parameters()).device)
    embedding = modules[0](zeros, grid)[0, p:]  # what the module adds to each patch token
    if torch.count_nonzero(embedding) == 0:
        raise ValueError(f"pos_embed={model.config.pos_embed!r} adds nothing: "
                         "no similarity to show")
    embedding = torch.nn.functional.normalize(embedding.float(), dim=-1)
    return (embedding @ embedding.t()).reshape(*grid, *grid)


@torch.no_grad()
def patch_embedding_components(model: VisionTransformer,
                               k: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k principal components of the patch-embedding filters, as (k, C, P, P) images, and
    the fraction of variance each explains. Only for the `patch` stem (a linear projection)."""
    proj = getattr(model.stem, "proj", None)
    if model.config.stem != "patch" or proj is None:
        raise ValueError("principal components need the linear patch projection; this model's "
                         f"stem is {model.config.stem!r}")
    filters = proj.weight.float()  # (D, C, P, P): one filter per embedding dimension
    flat = filters.reshape(filters.shape[0], -1)
    flat = flat - flat.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(flat, full_matrices=False)
    k = min(k, vh.shape[0])
    explained = (s**2 / (s**2).sum())[:k]
    return vh[:k].reshape(k, *filters.shape[1:]), explained
