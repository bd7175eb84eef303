"""The Transformer encoder, eq. (2)-(4), and where position embeddings are injected.

    z'_l = MSA(LN(z_{l-1})) + z_{l-1}        (2)
    z_l  = MLP(LN(z'_l)) + z'_l              (3)
    y    = LN(z_L)                           (4, before pooling)

Injection modes (Appendix D.4): `input` adds one embedding after the stem; `every_layer` adds a new
learned embedding at the input of every layer; `every_layer_shared` adds one embedding at the input
of every layer. An embedding that acts in attention (relative) lives inside each block instead.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError, PluginError
from vitzoo.layers.activations import ACTIVATIONS
from vitzoo.layers.attention import Attention
from vitzoo.options import closest

# the injection modes the encoder implements; a position embedding says which it supports (`modes`)
INJECTION_MODES = ("input", "every_layer", "every_layer_shared")


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample, scaling the survivors."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class MLP(nn.Module):
    """Two dense layers with a GELU between them; dropout after each (as the official MlpBlock)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.embed_dim, config.mlp_dim)
        self.fc2 = nn.Linear(config.mlp_dim, config.embed_dim)
        self.act = ACTIVATIONS[config.act]
        self.dropout = nn.Dropout(config.dropout)
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.normal_(fc.bias, std=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.dropout(self.act(self.fc1(x)))))


class EncoderBlock(nn.Module):
    """One pre-LN layer: eq. (2) then eq. (3)."""

    def __init__(self, config: ViTConfig, drop_path: float, relative: nn.Module | None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.embed_dim, eps=config.norm_eps)
        self.attn = Attention(config, relative)
        self.dropout = nn.Dropout(config.dropout)
        self.norm2 = nn.LayerNorm(config.embed_dim, eps=config.norm_eps)
        self.mlp = MLP(config)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, grid: tuple[int, int], attn_maps: list | None = None,
                outputs: int | None = None) -> torch.Tensor:
        """The layer's output tokens; only the first `outputs` of them if given (their attention
        still reads every token): a token's output depends on the others only through attention."""
        attended = self.attn(self.norm1(x), grid, attn_maps, queries=outputs)
        if outputs is not None:
            x = x[:, :outputs]
        x = x + self.drop_path(self.dropout(attended))  # (2)
        return x + self.drop_path(self.mlp(self.norm2(x)))  # (3)


def check_injection(config: ViTConfig, pos_embed_cls: type[nn.Module]) -> None:
    """A ConfigError (PluginError) for a mode the config (the position embedding) asks in vain."""
    mode, modes = config.pos_embed_mode, pos_embed_cls.modes
    unknown = [m for m in modes if m not in INJECTION_MODES]
    if unknown:
        raise PluginError(f"pos_embed {config.pos_embed!r} declares modes {unknown}, which the "
                          f"encoder does not implement; its modes must be among {INJECTION_MODES}")
    if mode not in INJECTION_MODES:
        raise ConfigError(f"pos_embed_mode={mode!r} is not one of {INJECTION_MODES}."
                          + closest(str(mode), INJECTION_MODES))
    if mode not in modes:
        raise ConfigError(f"pos_embed={config.pos_embed!r} with pos_embed_mode={mode!r} is "
                          f"undefined (the paper's Table 8 marks it n/a); {config.pos_embed!r} "
                          f"supports pos_embed_mode in {modes}")


class Encoder(nn.Module):
    """Position injection, L blocks, and the final LayerNorm."""

    def __init__(self, config: ViTConfig, pos_embed_cls: type[nn.Module], grid: tuple[int, int],
                 num_prefix_tokens: int) -> None:
        super().__init__()
        check_injection(config, pos_embed_cls)
        self.mode = config.pos_embed_mode
        self.grad_checkpointing = False

        def make() -> nn.Module:
            return pos_embed_cls(config, grid, num_prefix_tokens)

        in_attention = pos_embed_cls.in_attention
        if in_attention:
            self.pos_embed = None
        elif self.mode == "every_layer":
            self.pos_embed = nn.ModuleList(make() for _ in range(config.depth))
        else:
            self.pos_embed = make()
        self.dropout = nn.Dropout(config.dropout)
        # deeper layers are dropped more often (linear rule); plain floats for meta-device builds
        rates = [config.drop_path * i / max(config.depth - 1, 1) for i in range(config.depth)]
        self.blocks = nn.ModuleList(EncoderBlock(config, rate, make() if in_attention else None)
                                    for rate in rates)
        # with fc_norm the final LayerNorm acts on the pooled representation (the model's fc_norm)
        self.norm = (nn.Identity() if config.fc_norm
                     else nn.LayerNorm(config.embed_dim, eps=config.norm_eps))

    def inject(self, layer: int, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Add position information at the input of `layer` (0-based), as the mode says."""
        if self.pos_embed is None or (self.mode == "input" and layer > 0):
            return x
        pos_embed = self.pos_embed[layer] if self.mode == "every_layer" else self.pos_embed
        return pos_embed(x, grid)

    def forward(self, x: torch.Tensor, grid: tuple[int, int], attn_maps: list | None = None,
                outputs: int | None = None, layer_outputs: list | None = None,
                until: int | None = None) -> torch.Tensor:
        """The normed output tokens (B, T, D); with `outputs` only the first `outputs` of them (it
        spares the last block's MLP and attention output for the others). `layer_outputs` collects
        each block's output (before the final norm); `until` stops after that block."""
        x = self.dropout(self.inject(0, x, grid))
        last = len(self.blocks) - 1
        for layer, block in enumerate(self.blocks):
            if layer > 0:
                x = self.inject(layer, x, grid)
            kept = outputs if layer == last else None
            if self.grad_checkpointing and self.training and attn_maps is None:
                x = checkpoint(block, x, grid, None, kept, use_reentrant=False)
            else:
                x = block(x, grid, attn_maps, kept)
            if layer_outputs is not None:
                layer_outputs.append(x)
            if layer == until:
                break
        return self.norm(x)  # (4)

    def position_embeddings(self) -> list[nn.Module]:
        """Every position-embedding module, wherever it is injected."""
        if self.pos_embed is None:
            return [block.attn.relative for block in self.blocks]
        if isinstance(self.pos_embed, nn.ModuleList):
            return list(self.pos_embed)
        return [self.pos_embed]
