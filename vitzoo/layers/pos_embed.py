"""Position embeddings of Appendix D.4 (Table 8).

- `none`: the tokens are a bag of patches.
- `learned_1d`: E_pos of eq. (1), one learned vector per position of the raster-ordered sequence.
- `learned_2d`: a learned row and a learned column embedding of D/2 each, concatenated.
- `relative`: 1-D relative attention: a learned key per offset p_q - p_k between two patches, scored
  by the content query; the logits are added to the attention logits before the softmax.

Additive embeddings give the class token an embedding of its own, with no grid position. Resampling
to a new grid is linear with aligned corners, as the official `interpolate_posembed`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError

POS_STD = 0.02  # official init: normal(stddev=0.02)


def resample_grid(grid_embed: torch.Tensor, old: tuple[int, int],
                  new: tuple[int, int]) -> torch.Tensor:
    """(old_h * old_w, D) -> (new_h * new_w, D), bilinear with align_corners=True."""
    if old == new:
        return grid_embed
    dim = grid_embed.shape[-1]
    image = grid_embed.reshape(1, old[0], old[1], dim).permute(0, 3, 1, 2)
    image = F.interpolate(image.float(), size=new, mode="bilinear", align_corners=True)
    return image.permute(0, 2, 3, 1).reshape(new[0] * new[1], dim).to(grid_embed.dtype)


def resample_line(line: torch.Tensor, length: int) -> torch.Tensor:
    """(n, ...) -> (length, ...), linear along the first axis with align_corners=True."""
    if line.shape[0] == length:
        return line
    flat = line.reshape(line.shape[0], -1).t().unsqueeze(0).float()  # (1, C, n)
    flat = F.interpolate(flat, size=length, mode="linear", align_corners=True)
    return flat.squeeze(0).t().reshape(length, *line.shape[1:]).to(line.dtype)


class NoPosEmbed(nn.Module):
    """No position information at all (Table 8, first row)."""

    modes = ("input",)
    in_attention = False

    def __init__(self, config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int) -> None:
        super().__init__()
        self.grid = grid

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        return x

    def resample(self, grid: tuple[int, int]) -> None:
        self.grid = grid


class LearnedPosEmbed1d(nn.Module):
    """E_pos of eq. (1): one learned D-vector per sequence position (class token first)."""

    modes = ("input", "every_layer", "every_layer_shared")
    in_attention = False

    def __init__(self, config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int) -> None:
        super().__init__()
        self.grid, self.num_prefix_tokens = grid, num_prefix_tokens
        length = num_prefix_tokens + grid[0] * grid[1]
        self.weight = nn.Parameter(torch.randn(1, length, config.embed_dim) * POS_STD)

    def embedding(self, grid: tuple[int, int]) -> torch.Tensor:
        p = self.num_prefix_tokens
        return torch.cat([self.weight[0, :p], resample_grid(self.weight[0, p:], self.grid, grid)]
                         ).unsqueeze(0)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        return x + (self.weight if grid == self.grid else self.embedding(grid))

    @torch.no_grad()
    def resample(self, grid: tuple[int, int]) -> None:
        self.weight, self.grid = nn.Parameter(self.embedding(grid)), grid


class LearnedPosEmbed2d(nn.Module):
    """Row and column embeddings of D/2 each, concatenated: E_pos(y, x) = [row(y); col(x)]."""

    modes = ("input", "every_layer", "every_layer_shared")
    in_attention = False

    @classmethod
    def check(cls, config: ViTConfig) -> None:
        if config.embed_dim % 2:
            raise ConfigError(f"pos_embed='learned_2d' splits embed_dim in two halves; "
                              f"embed_dim={config.embed_dim} is odd")

    def __init__(self, config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int) -> None:
        super().__init__()
        self.grid, half = grid, config.embed_dim // 2
        self.row = nn.Parameter(torch.randn(grid[0], half) * POS_STD)
        self.col = nn.Parameter(torch.randn(grid[1], half) * POS_STD)
        prefix = (1, num_prefix_tokens, config.embed_dim)
        self.prefix = nn.Parameter(torch.randn(prefix) * POS_STD) if num_prefix_tokens else None

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        h, w = grid  # resampled for another grid only (the grid decides: torch.fx has no shapes)
        row = self.row if h == self.grid[0] else resample_line(self.row, h)
        col = self.col if w == self.grid[1] else resample_line(self.col, w)
        patches = torch.cat([row[:, None, :].expand(h, w, -1), col[None, :, :].expand(h, w, -1)],
                            dim=-1).reshape(1, h * w, -1)
        if self.prefix is not None:
            patches = torch.cat([self.prefix, patches], dim=1)
        return x + patches

    @torch.no_grad()
    def resample(self, grid: tuple[int, int]) -> None:
        self.row = nn.Parameter(resample_line(self.row, grid[0]))
        self.col = nn.Parameter(resample_line(self.col, grid[1]))
        self.grid = grid


class RelativePositionBias(nn.Module):
    """A learned key per offset between patches (2N - 1 of them, then one for every pair with the
    class token, which has no position), scored by the query; one instance in each block."""

    modes = ("input",)
    in_attention = True

    def __init__(self, config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int) -> None:
        super().__init__()
        self.grid, self.num_prefix_tokens = grid, num_prefix_tokens
        self.scale = config.head_dim**-0.5
        rows = 2 * grid[0] * grid[1] - 1 + (1 if num_prefix_tokens else 0)
        self.table = nn.Parameter(torch.randn(rows, config.num_heads, config.head_dim) * POS_STD)
        self.register_buffer("index", self.offset_index(grid), persistent=False)

    def offset_index(self, grid: tuple[int, int]) -> torch.Tensor:
        n, p = grid[0] * grid[1], self.num_prefix_tokens
        positions = torch.arange(n)
        index = torch.full((p + n, p + n), 2 * n - 1, dtype=torch.long)  # class-token pairs
        index[p:, p:] = positions[:, None] - positions[None, :] + (n - 1)
        return index

    def resampled_table(self, grid: tuple[int, int]) -> torch.Tensor:
        n, old_n = grid[0] * grid[1], self.grid[0] * self.grid[1]
        patches = resample_line(self.table[: 2 * old_n - 1], 2 * n - 1)
        return torch.cat([patches, self.table[2 * old_n - 1 :]])

    def forward(self, q: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """(B, heads, queries, tokens), for the queries of the first tokens (or all)."""
        if grid == self.grid:
            table, index = self.table, self.index
        else:
            table, index = self.resampled_table(grid), self.offset_index(grid).to(q.device)
        logits = torch.einsum("bhtd,rhd->bhtr", q, table.to(q.dtype)) * self.scale
        rows = torch.narrow(index, 0, 0, q.shape[2])  # (torch.fx records a narrow, not a slice)
        return logits.gather(-1, rows.expand(q.shape[0], q.shape[1], q.shape[2], -1))

    @torch.no_grad()
    def resample(self, grid: tuple[int, int]) -> None:
        self.table = nn.Parameter(self.resampled_table(grid))
        self.index = self.offset_index(grid).to(self.table.device)
        self.grid = grid
