"""Looking inside a trained ViT (section 4.5, Figures 6, 7 and 11).

- `mean_attention_distance`: per layer and head, the attention-weighted distance in pixels between
  a query patch and the patches it attends to, averaged over queries and images (Figure 11, D.7).
- `attention_rollout`: Abnar & Zuidema's rollout (Figure 6, D.8).
- `position_embedding_similarity`: cosine similarity of the patches' position embeddings (Figure 7).
- `patch_embedding_components`: principal components of the patch-embedding filters (Figure 7).
"""

from __future__ import annotations

import torch

from vitzoo.model import VisionTransformer


@torch.no_grad()
def mean_attention_distance(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """(layers, heads) mean attention distance in pixels, over patch queries and patch keys: the
    class token, which has no position, is left out and each query's attention renormalised."""
    maps = model.eval().get_attention_maps(images)
    (h, w), (sh, sw) = model.grid_size(tuple(images.shape[-2:])), model.stride
    ys, xs = (torch.arange(h) + 0.5) * sh, (torch.arange(w) + 0.5) * sw  # the patches' centres
    centres = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2)
    distance = torch.cdist(centres, centres).to(maps[0].device)  # (N, N) pixels
    p = model.num_prefix_tokens
    out = []
    for attn in maps:  # (B, H, T, T)
        patches = attn[:, :, p:, p:].float()
        patches = patches / patches.sum(-1, keepdim=True)
        out.append((patches * distance).sum(-1).mean(dim=(0, 2)))  # over images and queries
    return torch.stack(out)


@torch.no_grad()
def attention_rollout(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """(B, h, w): the heads averaged, the identity added for the residual, renormalised and
    multiplied through the layers; the class token's row, or the mean row without one (GAP)."""
    maps = model.eval().get_attention_maps(images)
    identity = torch.eye(maps[0].shape[-1], device=images.device)
    rollout = identity.expand(images.shape[0], -1, -1)
    for attn in maps:
        a = attn.float().mean(dim=1) + identity
        rollout = (a / a.sum(dim=-1, keepdim=True)) @ rollout
    p = model.num_prefix_tokens
    rows = rollout[:, 0, p:] if p else rollout[:, :, p:].mean(dim=1)
    rows = rows / rows.amax(dim=-1, keepdim=True)
    return rows.reshape(-1, *model.grid_size(tuple(images.shape[-2:])))


@torch.no_grad()
def position_embedding_similarity(model: VisionTransformer) -> torch.Tensor:
    """(h, w, h, w): the cosine similarity of the position embedding of patch (i, j) with patch
    (k, l), of the embedding added at the input (the first one for `every_layer`)."""
    modules = model.encoder.position_embeddings()
    if not modules or getattr(modules[0], "in_attention", False):
        raise ValueError(f"pos_embed={model.config.pos_embed!r} has no per-patch embedding vectors "
                         "to compare")
    grid, p = model.grid, model.num_prefix_tokens
    zeros = torch.zeros(1, p + grid[0] * grid[1], model.config.embed_dim,
                        device=next(model.parameters()).device)
    embedding = modules[0](zeros, grid)[0, p:]  # what the module adds to each patch token
    if torch.count_nonzero(embedding) == 0:
        raise ValueError(f"pos_embed={model.config.pos_embed!r} adds nothing: no similarity")
    embedding = torch.nn.functional.normalize(embedding.float(), dim=-1)
    return (embedding @ embedding.t()).reshape(*grid, *grid)


@torch.no_grad()
def patch_embedding_components(model: VisionTransformer,
                               k: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k principal components of the patch-embedding filters, as (k, C, P, P) images, and
    the fraction of variance each explains (the `patch` stem only: a linear projection)."""
    if model.config.stem != "patch":
        raise ValueError("principal components need the linear patch projection; this model's "
                         f"stem is {model.config.stem!r}")
    filters = model.stem.proj.weight.float()  # (D, C, P, P): one filter per embedding dimension
    flat = filters.reshape(filters.shape[0], -1)
    _, s, vh = torch.linalg.svd(flat - flat.mean(dim=0, keepdim=True), full_matrices=False)
    k = min(k, vh.shape[0])
    return vh[:k].reshape(k, *filters.shape[1:]), (s**2 / (s**2).sum())[:k]
