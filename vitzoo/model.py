"""The Vision Transformer, eq. (1)-(4) of the paper, top to bottom:

    z_0  = [x_class; x_p^1 E; ...; x_p^N E] + E_pos      (1)  stem, class token, position embedding
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                    (2)  `EncoderBlock`, `Attention`
    z_l  = MLP(LN(z'_l)) + z'_l                          (3)  `EncoderBlock`, `MLP`
    y    = LN(z_L^0)                                     (4)  `Encoder.norm`, then the pool

The stem, position embedding, pool and head are looked up by name in the registry (vitzoo.layers
holds the built-in ones). When the pool reads only the class token, `forward` computes the last
block for the class token alone (hooks on that block's MLP see it alone).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing as fx_tracing
from torch.utils.checkpoint import checkpoint

from vitzoo.weights import native, publish
from vitzoo.config import POOLS_OF_TIMM, ViTConfig
from vitzoo.errors import ConfigError, PluginError
from vitzoo.layers.init import xavier_uniform_blocks_
from vitzoo.registry import get_registry, resolve_config
from vitzoo.timm_surface import TimmSurface


class Attention(nn.Module):
    """Multi-head self-attention, the MSA of eq. (2), with q, k and v from one fused projection:
    softmax(q k^T / sqrt(d) + bias) v by PyTorch's fused kernel (SDPA), or written out for the
    attention maps and where `written_out` is set (`choose_attention`). Written out in training,
    the backward pass recomputes the probabilities, as the flash kernel does."""

    written_out = False

    def __init__(self, config: ViTConfig, relative: nn.Module | None = None) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.attn_dropout = config.attn_dropout
        self.qkv = nn.Linear(config.embed_dim, 3 * config.embed_dim)
        self.proj = nn.Linear(config.embed_dim, config.embed_dim)
        xavier_uniform_blocks_(self.qkv.weight, 3)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.qkv.bias)
        nn.init.zeros_(self.proj.bias)
        self.relative = relative  # a position embedding with in_attention=True, or None

    def project(self, x: torch.Tensor, queries: int | None) -> tuple[torch.Tensor, ...]:
        """q, k and v, each (B, heads, tokens, head_dim); q of the first `queries` tokens only."""
        batch, tokens, dim = x.shape
        heads = (self.num_heads, self.head_dim)
        if queries is None:
            return self.qkv(x).view(batch, tokens, 3, *heads).permute(2, 0, 3, 1, 4)
        # the weight's rows are [q; k; v]: q from its tokens alone, k and v from all (the query
        # rows copied: a strided input rounds torch.func's product otherwise)
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(x[:, :queries].contiguous(), w[:dim], b[:dim])
        kv = F.linear(x, w[dim:], b[dim:]).view(batch, tokens, 2, *heads).permute(2, 0, 3, 1, 4)
        return q.view(batch, queries, *heads).transpose(1, 2), *kv

    def forward(self, x: torch.Tensor, grid: tuple[int, int], attn_maps: list | None = None,
                queries: int | None = None) -> torch.Tensor:
        """The output of every token, or of the first `queries` (attending to every token);
        `attn_maps` collects the probabilities."""
        q, k, v = self.project(x, queries)
        if attn_maps is None and not self.written_out:
            dropout = self.attn_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.position_bias(q, grid),
                                                 dropout_p=dropout)
        elif attn_maps is None and self.training and not (
                torch._C._are_functorch_transforms_active()):  # which run no checkpoint hooks
            out = checkpoint(self.written_out_attention, q, k, v, grid, use_reentrant=False)
        else:
            out = self.written_out_attention(q, k, v, grid, attn_maps)
        return self.proj(out.transpose(1, 2).flatten(2))

    def written_out_attention(self, q, k, v, grid, attn_maps: list | None = None) -> torch.Tensor:
        logits = (q * self.head_dim**-0.5) @ k.contiguous().transpose(-2, -1)
        bias = self.position_bias(q, grid)
        probs = (logits if bias is None else logits + bias).softmax(dim=-1)
        if attn_maps is not None:
            attn_maps.append(probs.detach())
        return F.dropout(probs, self.attn_dropout, self.training) @ v

    def position_bias(self, q: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor | None:
        """The relative position bias of these queries to every token, if the model has one."""
        bias = None if self.relative is None else self.relative(q, grid)
        if bias is not None and not fx_tracing() and bias.shape[-2] != q.shape[2]:
            raise PluginError(f"{type(self.relative).__name__} gave an attention bias of shape "
                              f"{tuple(bias.shape)}, not one row per query (vitzoo/hookspecs.py)")
        return bias


def choose_attention(model: nn.Module, device, dtype: torch.dtype | None) -> None:
    """The attention kernel of `model` for computing in `dtype` on `device`: written out for bf16
    on a CPU, where it is faster than SDPA (docs/precision.md), SDPA everywhere else."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.written_out = torch.device(device).type == "cpu" and dtype == torch.bfloat16


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample, scaling the survivors."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        return x * x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep) / keep


class MLP(nn.Module):
    """Two dense layers with a GELU between them; dropout after each (the official MlpBlock)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.embed_dim, config.mlp_dim)
        self.fc2 = nn.Linear(config.mlp_dim, config.embed_dim)
        # exact GELU, or the official Flax code's tanh approximation (`ViTConfig.act`)
        self.act = partial(F.gelu, approximate="tanh" if config.act == "gelu_tanh" else "none")
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
        """The output tokens, or the first `outputs` (a token depends on the others only through
        the attention, which still reads every token)."""
        attended = self.attn(self.norm1(x), grid, attn_maps, queries=outputs)
        x = x if outputs is None else x[:, :outputs]
        x = x + self.drop_path(self.dropout(attended))  # (2)
        return x + self.drop_path(self.mlp(self.norm2(x)))  # (3)


class Encoder(nn.Module):
    """Position injection (Appendix D.4), L blocks and the final LayerNorm. `input` adds one
    embedding after the stem, `every_layer` a new one at the input of every layer,
    `every_layer_shared` one at the input of every layer; a relative one lives in each block."""

    def __init__(self, config: ViTConfig, pos_embed_cls: type[nn.Module], grid: tuple[int, int],
                 num_prefix_tokens: int) -> None:
        super().__init__()
        self.mode, self.grad_checkpointing = config.pos_embed_mode, False
        make = partial(pos_embed_cls, config, grid, num_prefix_tokens)
        in_attention = pos_embed_cls.in_attention
        if in_attention:
            self.pos_embed = None
        elif self.mode == "every_layer":
            self.pos_embed = nn.ModuleList(make() for _ in range(config.depth))
        else:
            self.pos_embed = make()
        self.dropout = nn.Dropout(config.dropout)
        # deeper layers are dropped more often (linear rule)
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
        return (self.pos_embed[layer] if self.mode == "every_layer" else self.pos_embed)(x, grid)

    def forward(self, x: torch.Tensor, grid: tuple[int, int], attn_maps: list | None = None,
                outputs: int | None = None, layer_outputs: list | None = None,
                until: int | None = None) -> torch.Tensor:
        """The normed tokens (B, T, D), or the first `outputs` (the last block computes those
        alone); `layer_outputs` collects each block's output; `until` stops after that block."""
        x = self.dropout(self.inject(0, x, grid))
        for layer, block in enumerate(self.blocks):
            x = self.inject(layer, x, grid) if layer > 0 else x
            kept = outputs if layer == len(self.blocks) - 1 else None
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
        many = isinstance(self.pos_embed, nn.ModuleList)
        return list(self.pos_embed) if many else [self.pos_embed]


class VisionTransformer(TimmSurface, nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        parts = get_registry().parts(config)  # each part by name, each checking the config
        self.config = config
        self.stem = parts["stem"](config)  # x_p E of eq. (1)
        self.pool = parts["pool"](config)
        self.num_prefix_tokens = self.pool.num_prefix_tokens
        self.tokens_read = getattr(self.pool, "tokens_read", None)  # of the last block (None: all)
        # x_class of eq. (1), zero-initialised as in the official code
        dim = config.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if self.num_prefix_tokens else None
        # E_pos of eq. (1), eq. (2)-(3) and the LayerNorm of eq. (4)
        self.encoder = Encoder(config, parts["pos_embed"], self.grid_size(config.img_size),
                               self.num_prefix_tokens)
        self.fc_norm = nn.LayerNorm(dim, eps=config.norm_eps) if config.fc_norm else None
        self.head = parts["head"](config)
        self.labels: list[str] | None = None  # the head's class names, when the weights name them
        self.pretrained_tag = None  # the vitzoo.zoo.PretrainedTag the weights came from, if any

    @property
    def stride(self) -> tuple[int, int]:  # pixels per token along (height, width)
        return tuple(self.stem.stride)

    def grid_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The token grid of an image size; an error if the stem's stride does not divide it."""
        (h, w), (sh, sw) = img_size, self.stride
        if h % sh or w % sw:
            near = (max(1, round(h / sh)) * sh, max(1, round(w / sw)) * sw)
            raise ConfigError(f"img_size={tuple(img_size)} is not divisible by the stem's stride "
                              f"{(sh, sw)} (stem={self.config.stem!r}); use e.g. {near}")
        return (h // sh, w // sw)

    @property
    def grid(self) -> tuple[int, int]:
        return self.grid_size(self.config.img_size)

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Change the configured resolution, resampling every position embedding in place."""
        config = self.config.replace(img_size=img_size)
        grid = self.grid_size(config.img_size)
        for pos_embed in self.encoder.position_embeddings():
            pos_embed.resample(grid)
        self.config = config

    def check_input(self, x: torch.Tensor) -> tuple[int, int]:
        """The token grid of a batch of images (under torch.fx, whose input has no shape, the
        configured one); torch itself refuses a wrong device, dtype or number of channels."""
        if fx_tracing():
            return self.grid
        if x.ndim != 4:
            raise ValueError(f"expected images (B, C, H, W), got shape {tuple(x.shape)}"
                             + ("; add a batch dimension: x.unsqueeze(0)" if x.ndim == 3 else ""))
        if not x.is_floating_point():
            raise ValueError(f"expected floating-point images, got {x.dtype}; convert with "
                             f"x.float(), normalise with mean={self.config.mean}, "
                             f"std={self.config.std}")
        size = tuple(x.shape[2:])
        if size != self.config.img_size and not self.config.dynamic_img_size:
            raise ValueError(f"input size {size} differs from the configured img_size "
                             f"{self.config.img_size}; resize it, call model.set_img_size(...) or "
                             "build the model with dynamic_img_size=True")
        return self.grid_size(size)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Images -> [x_class; x_p E] (eq. 1 before E_pos), and the token grid."""
        grid = self.check_input(x)
        tokens = self.stem(x)
        if self.cls_token is not None:
            cls_token = self.cls_token.expand(tokens.shape[0], -1, -1).to(tokens.dtype)
            tokens = torch.cat([cls_token, tokens], dim=1)
        return tokens, grid

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's output tokens after the final LayerNorm, (B, T, D)."""
        return self.encoder(*self.embed(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool the normed tokens and apply the head (or stop before the classifier)."""
        x = self.pool(x)
        x = x if self.fc_norm is None else self.fc_norm(x)
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a torch.fx graph (for feature extraction) computes every token of the last block
        read = None if fx_tracing() else self.tokens_read
        return self.forward_head(self.encoder(*self.embed(x), outputs=read))

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Attention probabilities of every layer, each (B, heads, T, T), for inspection."""
        maps: list[torch.Tensor] = []
        self.encoder(*self.embed(x), attn_maps=maps)
        return maps

    def reset_classifier(self, num_classes: int, global_pool: str | None = None,
                         head: str | None = None) -> None:
        """A new zero-initialised head for `num_classes` (fine-tuning); head='linear' drops the
        pre-logits layer too, as the paper's fine-tuning does. `global_pool` is timm's, but the pool
        stays: it decides the class token."""
        pool = POOLS_OF_TIMM.get(global_pool, global_pool)
        if global_pool is not None and pool != self.config.pool:
            raise ConfigError(f"reset_classifier(global_pool={global_pool!r}): this model pools "
                              f"with {self.config.pool!r}, which decides the class token; build "
                              f"the model with pool={pool!r} instead")
        changes = {"num_classes": num_classes, **({"head": head} if head is not None else {})}
        config = resolve_config(self.config.replace(**changes))  # a new head: its own defaults
        reference = next(self.parameters())
        head_cls = get_registry().get("head", config.head)
        self.head = head_cls(config).to(device=reference.device, dtype=reference.dtype)
        self.config = config

    def no_weight_decay(self) -> set[str]:
        """Parameters weight decay skips: the class token and the position embeddings."""
        embeddings = {id(p) for module in self.encoder.position_embeddings()
                      for p in module.parameters()}
        skip = {"cls_token"} if self.cls_token is not None else set()
        return skip | {name for name, p in self.named_parameters() if id(p) in embeddings}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass instead of storing its activations."""
        self.encoder.grad_checkpointing = enable

    def save_pretrained(self, directory, card: dict | None = None, format: str = "vitzoo") -> None:
        """Write config.json, model.safetensors and a model card (`card`: dataset, metrics, license,
        tags) into `directory`, atomically, in the layout of `format` (docs/weights.md)."""
        self.check_describable("save")
        native.save_pretrained(self, directory, card=card, layout=format)

    def push_to_hub(self, repo_id: str, token: str | None = None, private: bool = False,
                    revision: str | None = None, commit_message: str = "Upload vitzoo model",
                    **kwargs) -> str:
        """Upload what `save_pretrained` writes (format="auto") to the Hub repo `repo_id` in one
        commit; returns the commit URL."""
        self.check_describable("push")
        return publish.push_to_hub(self, repo_id, token=token, private=private, revision=revision,
                                   commit_message=commit_message, **kwargs)
