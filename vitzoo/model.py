"""VisionTransformer: eq. (1)-(4), each part looked up by name in the registry.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos      (1)  stem, class token, position embedding
    z_l = encoder blocks                                 (2, 3)
    y   = LN(z_L), pooled                                (4)  final norm, then `pool`
    logits = head(y)

`forward_features` returns the normed tokens, `forward_head` pools them and applies the head.
`forward` computes what the two compute, but when the pool reads only the class token the last
block computes the class token's output alone (hooks on that block's MLP see it alone).
"""

from __future__ import annotations

import torch
from torch import nn

from vitzoo.weights import native, publish
from vitzoo.config import POOLS_OF_TIMM, ViTConfig
from vitzoo.errors import ConfigError, InputError, PluginError
from vitzoo.layers.encoder import Encoder
from vitzoo.registry import get_registry, resolve_config
from vitzoo.timm_surface import TimmSurface
from vitzoo.tracing import fx_tracing


class VisionTransformer(TimmSurface, nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        parts = get_registry().parts(config)  # each part by name, each checking the config
        self.config = config
        self.stem = parts["stem"](config)  # x_p E of eq. (1)
        self.pool = parts["pool"](config)
        self.num_prefix_tokens = self.pool.num_prefix_tokens
        # the tokens of the last block the pool reads (None: all), chosen once here
        self.tokens_read = getattr(self.pool, "tokens_read", None)
        # x_class of eq. (1), zero-initialised as in the official code
        dim = config.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if self.num_prefix_tokens else None
        # E_pos of eq. (1), eq. (2)-(3) and the LayerNorm of eq. (4)
        grid = self.grid_size(config.img_size)
        self.encoder = Encoder(config, parts["pos_embed"], grid, self.num_prefix_tokens)
        # timm's fc_norm: the final LayerNorm after the pooling (the encoder's is then the identity)
        self.fc_norm = nn.LayerNorm(dim, eps=config.norm_eps) if config.fc_norm else None
        self.head = parts["head"](config)
        self.labels: list[str] | None = None  # the head's class names, when the weights name them
        self.pretrained_tag = None  # the vitzoo.zoo.PretrainedTag the weights came from, if any

    # ------------------------------------------------------------------ geometry
    @property
    def stride(self) -> tuple[int, int]:
        """Pixels per token along (height, width)."""
        return tuple(self.stem.stride)

    def grid_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The token grid for an image size; an error if the stem's stride does not divide it."""
        (h, w), (sh, sw) = img_size, self.stride
        if h % sh or w % sw:
            near = (max(1, round(h / sh)) * sh, max(1, round(w / sw)) * sw)
            raise ConfigError(f"img_size={tuple(img_size)} is not divisible by the stem's stride "
                              f"{(sh, sw)} (stem={self.config.stem!r}, patch_size="
                              f"{self.config.patch_size}); use a multiple, e.g. {near}")
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
        """Refuse a batch the model cannot read, saying why; return its token grid. Under torch.fx
        (torchvision's `create_feature_extractor`) the input has no shape: the configured grid."""
        if fx_tracing():
            return self.grid
        config = self.config
        if not isinstance(x, torch.Tensor):
            raise InputError("expected a torch.Tensor of images (B, C, H, W), got "
                             f"{type(x).__name__}")
        if x.ndim != 4:
            hint = "; add a batch dimension with x.unsqueeze(0)" if x.ndim == 3 else ""
            raise InputError(f"expected images of shape (B, C, H, W), got a tensor of shape "
                             f"{tuple(x.shape)}{hint}")
        if not x.is_floating_point():
            raise InputError(f"expected floating-point images, got dtype {x.dtype}; convert with "
                             f"x.float() and normalise with mean={config.mean}, std={config.std}")
        if x.shape[1] != config.in_chans:
            raise InputError(f"expected {config.in_chans} input channels (in_chans), got "
                             f"{x.shape[1]} in a tensor of shape {tuple(x.shape)}")
        weight = next(self.parameters(), None)
        if weight is not None and x.device != weight.device:
            raise InputError(f"the input is on {x.device} but the model is on {weight.device}; "
                             f"move one of them (x.to({str(weight.device)!r}) or "
                             f"model.to({str(x.device)!r}))")
        if (weight is not None and x.dtype != weight.dtype
                and not torch.is_autocast_enabled(x.device.type)):
            raise InputError(f"the input is {x.dtype} but the model's weights are {weight.dtype}; "
                             f"convert with x.to({weight.dtype}), or run under torch.autocast for "
                             "mixed precision")
        size = (x.shape[2], x.shape[3])
        if size != config.img_size and not config.dynamic_img_size:
            raise InputError(f"input size {size} differs from the configured img_size "
                             f"{config.img_size}; resize the input, call model.set_img_size(...) "
                             "or build the model with dynamic_img_size=True")
        try:
            return self.grid_size(size)
        except ConfigError as exc:
            raise InputError(str(exc)) from None

    # ------------------------------------------------------------------ forward
    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Images -> [x_class; x_p E] (eq. 1 before E_pos), and the token grid."""
        grid = self.check_input(x)
        tokens = self.stem(x)
        expected = (grid[0] * grid[1], self.config.embed_dim)
        if not fx_tracing() and tokens.shape[1:] != expected:
            raise PluginError(f"stem {self.config.stem!r} returned tokens of shape "
                              f"{tuple(tokens.shape)} for a {grid[0]}x{grid[1]} grid (its stride "
                              f"{self.stride}); a stem must return (B, h * w, embed_dim="
                              f"{self.config.embed_dim})")
        if self.cls_token is not None:
            cls_token = self.cls_token.expand(tokens.shape[0], -1, -1).to(tokens.dtype)
            tokens = torch.cat([cls_token, tokens], dim=1)
        return tokens, grid

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's output tokens after the final LayerNorm, (B, T, D)."""
        tokens, grid = self.embed(x)
        return self.encoder(tokens, grid)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool the normed tokens and apply the head (or stop before the classifier)."""
        x = self.pool(x)
        if self.fc_norm is not None:
            x = self.fc_norm(x)
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, grid = self.embed(x)
        # a torch.fx graph (for feature extraction) computes every token of the last block
        read = None if fx_tracing() else self.tokens_read
        return self.forward_head(self.encoder(tokens, grid, outputs=read))

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Attention probabilities of every layer, each (B, heads, T, T), for inspection."""
        tokens, grid = self.embed(x)
        maps: list[torch.Tensor] = []
        self.encoder(tokens, grid, attn_maps=maps)
        return maps

    # ------------------------------------------------------------------ training and saving
    def reset_classifier(self, num_classes: int, global_pool: str | None = None,
                         head: str | None = None) -> None:
        """A new zero-initialised head for `num_classes` (fine-tuning); head='linear' also drops the
        pre-logits layer, as the paper's fine-tuning does. `global_pool` as timm's: the pooling
        stays (it decides the class token), and naming another one is an error saying so."""
        pool = POOLS_OF_TIMM.get(global_pool, global_pool)
        if global_pool is not None and pool != self.config.pool:
            raise ConfigError(f"reset_classifier(global_pool={global_pool!r}): this model pools "
                              f"with {self.config.pool!r}; the pooling decides the class token, so "
                              f"build the model with pool={pool!r} instead")
        changes: dict = {"num_classes": num_classes}
        if head is not None:  # another head starts from its own defaults (ViTConfig.replace)
            changes["head"] = head
        config = resolve_config(self.config.replace(**changes))
        reference = next(self.parameters())
        head_cls = get_registry().get("head", config.head)
        self.head = head_cls(config).to(device=reference.device, dtype=reference.dtype)
        self.config = config

    def no_weight_decay(self) -> set[str]:
        """Parameters weight decay skips: the class token and the position embeddings."""
        skip = {"cls_token"} if self.cls_token is not None else set()
        embeddings = {id(p) for module in self.encoder.position_embeddings()
                      for p in module.parameters()}
        return skip | {name for name, p in self.named_parameters() if id(p) in embeddings}

    def save_pretrained(self, directory, card: dict | None = None, format: str = "vitzoo") -> None:
        """Write config.json, model.safetensors and a README.md model card into `directory`,
        atomically; `card` may give dataset, metrics, license, tags (vitzoo.weights.card).
        `format`: "vitzoo", "timm" or "transformers" (that library's config keys and tensor names,
        refused for a model it cannot build), or "auto" (timm's, else transformers', else
        vitzoo's)."""
        self.check_describable("save")
        native.save_pretrained(self, directory, card=card, layout=format)

    def push_to_hub(self, repo_id: str, token: str | None = None, private: bool = False,
                    revision: str | None = None, commit_message: str = "Upload vitzoo model",
                    **kwargs) -> str:
        """Upload what `save_pretrained` writes to the Hub repo `repo_id` (created when missing) as
        one commit; returns the commit URL. `format="auto"` (the default) writes timm's layout where
        timm builds the model, else transformers', else vitzoo's (vitzoo.weights.publish)."""
        self.check_describable("push")
        return publish.push_to_hub(self, repo_id, token=token, private=private, revision=revision,
                                   commit_message=commit_message, **kwargs)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass instead of storing its activations."""
        self.encoder.grad_checkpointing = enable

    def set_attention_probabilities_stored(self, enable: bool = True) -> None:
        """In bf16 training on the CPU, where the attention is written out, store its T x T probabilities
        for the backward pass instead of recomputing them from q and k there: memory for a little
        speed (compiled steps on a 2-core CPU: 0.5-3% faster, for +3% to +10% peak tensor memory, which
        grows with the square of the tokens). No effect elsewhere:
        inference stores nothing, and in float32 and on GPUs SDPA's fused kernels are faster."""
        for block in self.encoder.blocks:
            block.attn.store_probabilities = enable
