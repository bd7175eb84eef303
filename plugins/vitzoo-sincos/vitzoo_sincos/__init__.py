"""vitzoo plugin: `pos_embed="sincos_2d"`, the fixed 2-D sine-cosine position embedding of MoCo v3
(Chen et al. 2021) and "Simple ViT" (Beyer et al. 2022). For the patch at row y and column x, with
q = D / 4 and omega_k = 1 / 10000 ** (k / q):

    E(y, x) = [sin(y omega), cos(y omega), sin(x omega), cos(x omega)]      (each q wide)

The class token gets zeros. Nothing is learned: the table is a buffer that is not saved (a function
of the grid), computed afresh for another grid; with every_layer all layers' tables are equal.
"""

from __future__ import annotations

import torch
from torch import nn

from vitzoo import hookimpl
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError


def sincos_2d_table(grid: tuple[int, int], dim: int) -> torch.Tensor:
    """The (h * w, dim) table, rows in row-major order of the grid, in float64."""
    quarter = dim // 4
    omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    rows, cols = (torch.arange(n, dtype=torch.float64)[:, None] * omega for n in grid)
    row_half, col_half = (torch.cat([a.sin(), a.cos()], dim=1) for a in (rows, cols))
    h, w = grid
    return torch.cat([row_half[:, None].expand(h, w, -1), col_half[None].expand(h, w, -1)],
                     dim=-1).reshape(h * w, dim)


class SinCosPosEmbed2d(nn.Module):
    modes = ("input", "every_layer", "every_layer_shared")
    in_attention = False

    @classmethod
    def check(cls, config: ViTConfig) -> None:
        if config.embed_dim % 4:
            raise ConfigError(f"pos_embed='sincos_2d' splits embed_dim in four quarters; "
                              f"embed_dim={config.embed_dim} is not divisible by 4")

    def __init__(self, config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int) -> None:
        super().__init__()
        self.embed_dim, self.num_prefix_tokens = config.embed_dim, num_prefix_tokens
        self.grid = tuple(grid)
        device = torch.empty(0).device  # where a factory would build (`with torch.device("meta")`)
        self.register_buffer("embedding", self.table(self.grid).to(device), persistent=False)

    def table(self, grid: tuple[int, int]) -> torch.Tensor:
        """(1, num_prefix_tokens + h * w, D): zeros for the class token, then the grid's."""
        prefix = torch.zeros(self.num_prefix_tokens, self.embed_dim, dtype=torch.float64)
        return torch.cat([prefix, sincos_2d_table(grid, self.embed_dim)]).float().unsqueeze(0)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        grid = tuple(grid)
        embedding = self.embedding if grid == self.grid else self.table(grid).to(x.device)
        return x + embedding.to(x.dtype)

    @torch.no_grad()
    def resample(self, grid: tuple[int, int]) -> None:
        self.embedding, self.grid = self.table(grid).to(self.embedding.device), tuple(grid)


@hookimpl
def vitzoo_pos_embeds():
    return {"sincos_2d": SinCosPosEmbed2d}
