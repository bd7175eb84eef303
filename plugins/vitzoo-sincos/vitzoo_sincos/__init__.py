"""vitzoo plugin: `pos_embed="sincos_2d"`, the fixed 2-D sine-cosine position embedding.

The embedding of MoCo v3 (Chen et al. 2021, `build_2d_sincos_position_embedding`) and of "Simple
ViT" (Beyer et al. 2022, "Better plain ViT baselines"): nothing is learned. For the patch at row y and
column x of the token grid, with D = embed_dim and q = D / 4,

    omega_k  = 1 / 10000 ** (k / q)                       k = 0 .. q - 1
    E(y, x)  = [sin(y omega), cos(y omega), sin(x omega), cos(x omega)]     (each part q wide)

so the first half of D encodes the row and the second half the column (the order of vitzoo's
`learned_2d`), each half the sine and cosine of the coordinate at geometric frequencies from 1 down
to ~1/10000. For a square grid this is numerically MoCo v3's table. The class token has no grid
position and gets a zero embedding.

The table is a buffer, not a parameter: it is not trained, not weight-decayed and not saved in the
state dict (`persistent=False`) since it is a function of the grid alone. `forward` on another grid
computes that grid's table on the fly; `resample(grid)` replaces the buffer. With
`pos_embed_mode="every_layer"` each layer gets its own instance, but as nothing is learned they are
all equal, so it behaves exactly like `every_layer_shared`.
"""

from __future__ import annotations

import torch
from torch import nn

from vitzoo import hookimpl
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError

__all__ = ["SinCosPosEmbed2d", "sincos_2d_table", "vitzoo_pos_embeds"]

TEMPERATURE = 10_000.0


def sincos_2d_table(
    grid: tuple[int, int],
    dim: int,
    temperature: float = TEMPERATURE,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The (h * w, dim) table, rows in row-major order of the grid; computed in float64 on the CPU."""
    if dim % 4:
        raise ConfigError(f"the 2-D sine-cosine embedding needs a dimension divisible by 4, got {dim}")
    h, w = grid
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64, device="cpu") / quarter)
    rows = torch.arange(h, dtype=torch.float64, device="cpu")[:, None] * omega  # (h, q)
    cols = torch.arange(w, dtype=torch.float64, device="cpu")[:, None] * omega  # (w, q)
    row_half = torch.cat([rows.sin(), rows.cos()], dim=1)  # (h, D/2)
    col_half = torch.cat([cols.sin(), cols.cos()], dim=1)  # (w, D/2)
    table = torch.cat([row_half[:, None, :].expand(h, w, -1), col_half[None, :, :].expand(h, w, -1)], dim=-1)
    return table.reshape(h * w, dim).to(device=device, dtype=dtype)


def _default_device() -> torch.device:
    # the device a factory function would use here (honours `with torch.device(...)`, e.g. "meta")
    return torch.empty(0).device


class SinCosPosEmbed2d(nn.Module):
    """Fixed 2-D sine-cosine position embedding, added to the tokens (vitzoo pos_embed contract)."""

    modes = ("input", "every_layer", "every_layer_shared")
    in_attention = False
    temperature = TEMPERATURE

    @classmethod
    def check(cls, config: ViTConfig) -> None:
        if config.embed_dim % 4:
            lower = config.embed_dim - config.embed_dim % 4
            raise ConfigError(
                f"pos_embed='sincos_2d' splits embed_dim into four quarters (sin and cos of the row, sin and "
                f"cos of the column); embed_dim={config.embed_dim} is not divisible by 4 "
                f"(use e.g. {lower or 4} or {lower + 4}, keeping it divisible by num_heads={config.num_heads})"
            )

    def __init__(self, config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int) -> None:
        super().__init__()
        self.check(config)
        self.embed_dim = config.embed_dim
        self.num_prefix_tokens = num_prefix_tokens
        self.grid = tuple(grid)
        self.register_buffer("embedding", self._embedding(self.grid, _default_device()), persistent=False)

    def _embedding(self, grid: tuple[int, int], device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(1, num_prefix_tokens + h * w, D): zeros for the class token, then the grid's table."""
        table = sincos_2d_table(grid, self.embed_dim, self.temperature, device=device, dtype=dtype)
        prefix = torch.zeros(self.num_prefix_tokens, self.embed_dim, device=device, dtype=dtype)
        return torch.cat([prefix, table]).unsqueeze(0)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        grid = tuple(grid)
        expected = self.num_prefix_tokens + grid[0] * grid[1]
        if x.shape[-2] != expected:
            raise ValueError(
                f"sincos_2d: {x.shape[-2]} tokens do not match grid {grid} plus {self.num_prefix_tokens} "
                f"class token(s) ({expected} expected)"
            )
        embedding = self.embedding if grid == self.grid else self._embedding(grid, x.device, self.embedding.dtype)
        return x + embedding.to(x.dtype)

    @torch.no_grad()
    def resample(self, grid: tuple[int, int]) -> None:
        """Recompute the table for a new grid (nothing to interpolate: the formula is exact)."""
        grid = tuple(grid)
        self.embedding = self._embedding(grid, self.embedding.device, self.embedding.dtype)
        self.grid = grid

    def extra_repr(self) -> str:
        return f"dim={self.embed_dim}, grid={self.grid}, temperature={self.temperature:g}, fixed"


@hookimpl
def vitzoo_pos_embeds():
    return {"sincos_2d": SinCosPosEmbed2d}
