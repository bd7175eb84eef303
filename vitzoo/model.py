"""VisionTransformer: eq. (1)-(4) assembled from registered components.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos      (1)  stem, class token, position embedding
    z_l = encoder blocks                                 (2, 3)
    y   = LN(z_L), pooled                                (4)  final norm, then `pool`
    logits = head(y)

`forward_features` returns the normed tokens, `forward_head` pools them and applies the head (the
split that feature extraction, linear probes and fine-tuning need). `forward` computes what
`forward_head(forward_features(x))` computes, but when the pool reads only the class token the last
block skips the patch tokens' outputs, which nothing reads (6.9% of ViT-B/16's FLOPs); hooks on that
block's MLP see the class token alone.
"""

from __future__ import annotations

import torch
from torch import nn

from vitzoo.checkpoints import native, publish
from vitzoo.config import POOLS_OF_TIMM, ViTConfig
from vitzoo.errors import ConfigError, InputError, PluginError
from vitzoo.layers.encoder import Encoder
from vitzoo.registry import COMPONENT_KINDS, get_registry, resolve_config
from vitzoo.timm_surface import TimmSurface
from vitzoo.tracing import fx_tracing


class VisionTransformer(TimmSurface, nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        registry = get_registry()
        config = resolve_config(config)  # every part known, its options checked and complete
        parts = {kind: registry.get(kind, getattr(config, kind)) for kind in COMPONENT_KINDS}
        self.config = config
        self.stem = parts["stem"](config)
        grid = self.grid_size(config.img_size)
        self.pool = parts["pool"](config)
        self.num_prefix_tokens = self.pool.num_prefix_tokens
        # the learnable x_class of eq. (1); zero-initialised as in the official code
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.embed_dim)) if self.num_prefix_tokens else None
        self.encoder = Encoder(config, parts["pos_embed"], grid, self.num_prefix_tokens)
        # timm's fc_norm: the final LayerNorm after the pooling (the encoder's is then the identity)
        self.fc_norm = nn.LayerNorm(config.embed_dim, eps=config.norm_eps) if config.fc_norm else None
        self.head = parts["head"](config)
        # the names of the head's classes, in order, when the weights come with them (see vitzoo.labels)
        self.labels: list[str] | None = None
        # the pretrained tag the weights were loaded from (vitzoo.tags), if any
        self.pretrained_tag = None

    # ------------------------------------------------------------------ geometry
    @property
    def stride(self) -> tuple[int, int]:
        """Pixels per token along (height, width)."""
        return tuple(self.stem.stride)

    def grid_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The token grid for an image size; an error if the stem's stride does not divide it."""
        (h, w), (sh, sw) = img_size, self.stride
        if h % sh or w % sw:
            raise ConfigError(
                f"img_size={tuple(img_size)} is not divisible by the stem's stride {(sh, sw)} "
                f"(stem={self.config.stem!r}, patch_size={self.config.patch_size}); use a multiple, "
                f"e.g. {(max(1, round(h / sh)) * sh, max(1, round(w / sw)) * sw)}"
            )
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

    def _check_input(self, x: torch.Tensor) -> tuple[int, int]:
        """Validate an input batch at the boundary; return its token grid. While torch.fx traces the
        model (torchvision's `create_feature_extractor`) the input is a Proxy with no shape to check:
        the graph is then that of the configured img_size, whose grid this returns."""
        if fx_tracing():
            return self.grid
        if not isinstance(x, torch.Tensor):
            raise InputError(f"expected a torch.Tensor of images (B, C, H, W), got {type(x).__name__}")
        if x.ndim != 4:
            hint = "; add a batch dimension with x.unsqueeze(0)" if x.ndim == 3 else ""
            raise InputError(f"expected images of shape (B, C, H, W), got a tensor of shape {tuple(x.shape)}{hint}")
        if not x.is_floating_point():
            raise InputError(
                f"expected floating-point images, got dtype {x.dtype}; convert with x.float() and normalise "
                f"with mean={self.config.mean}, std={self.config.std}"
            )
        if x.shape[1] != self.config.in_chans:
            raise InputError(
                f"expected {self.config.in_chans} input channels (in_chans), got {x.shape[1]} "
                f"in a tensor of shape {tuple(x.shape)}"
            )
        weight = next(self.parameters(), None)
        if weight is not None and x.device != weight.device:
            raise InputError(f"the input is on {x.device} but the model is on {weight.device}; move one of them "
                             f"(x.to({str(weight.device)!r}) or model.to({str(x.device)!r}))")
        if weight is not None and x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise InputError(f"the input is {x.dtype} but the model's weights are {weight.dtype}; convert with "
                             f"x.to({weight.dtype}), or run under torch.autocast for mixed precision")
        size = (x.shape[2], x.shape[3])
        if size != self.config.img_size and not self.config.dynamic_img_size:
            raise InputError(
                f"input size {size} differs from the configured img_size {self.config.img_size}; resize the "
                "input, call model.set_img_size(...) or build the model with dynamic_img_size=True"
            )
        try:
            return self.grid_size(size)
        except ConfigError as exc:
            raise InputError(str(exc)) from None

    # ------------------------------------------------------------------ forward
    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Image -> [x_class; x_p E] (eq. 1 before E_pos), and the token grid."""
        grid = self._check_input(x)
        tokens = self.stem(x)
        if not fx_tracing() and tokens.shape[1:] != (grid[0] * grid[1], self.config.embed_dim):
            raise PluginError(
                f"stem {self.config.stem!r} returned tokens of shape {tuple(tokens.shape)} for a {grid[0]}x{grid[1]} grid "
                f"(its stride {self.stride}); a stem must return (B, h * w, embed_dim={self.config.embed_dim})"
            )
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1).to(tokens.dtype), tokens], dim=1)
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
        # a torch.fx graph is traced for feature extraction: its last block gives every token
        read = None if fx_tracing() else getattr(self.pool, "tokens_read", None)
        return self.forward_head(self.encoder(tokens, grid, outputs=read))

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Attention probabilities of every layer, each (B, heads, T, T), for inspection."""
        tokens, grid = self.embed(x)
        maps: list[torch.Tensor] = []
        self.encoder(tokens, grid, attn_maps=maps)
        return maps

    # ------------------------------------------------------------------ training helpers
    def reset_classifier(self, num_classes: int, global_pool: str | None = None, head: str | None = None) -> None:
        """A new zero-initialised head for `num_classes` (fine-tuning); head='linear' also drops the
        pre-logits layer, as the paper's fine-tuning does. `global_pool` as timm's: the pooling stays
        (it decides whether there is a class token); naming another one is an error saying so."""
        if global_pool is not None and POOLS_OF_TIMM.get(global_pool, global_pool) != self.config.pool:
            raise ConfigError(f"reset_classifier(global_pool={global_pool!r}): this model pools with "
                              f"{self.config.pool!r}; the pooling decides the class token, so build the model with "
                              f"pool={POOLS_OF_TIMM.get(global_pool, global_pool)!r} instead")
        changes: dict = {"num_classes": num_classes}
        if head is not None:  # another head starts from its own defaults (ViTConfig.replace)
            changes["head"] = head
        config = resolve_config(self.config.replace(**changes))
        head_cls = get_registry().get("head", config.head)
        reference = next(self.parameters())
        self.head = head_cls(config).to(device=reference.device, dtype=reference.dtype)
        self.config = config

    def no_weight_decay(self) -> set[str]:
        """Names of parameters that weight decay should skip: the class token and position embeddings."""
        skip = {"cls_token"} if self.cls_token is not None else set()
        embeddings = {id(p) for module in self.encoder.position_embeddings() for p in module.parameters()}
        skip |= {name for name, p in self.named_parameters() if id(p) in embeddings}
        return skip

    def save_pretrained(self, directory, card: dict | None = None, format: str = "vitzoo") -> None:
        """Write config.json, model.safetensors and a README.md model card into `directory`,
        atomically; `card` may give dataset, metrics, license, tags (see vitzoo.checkpoints.card).
        `format`: "vitzoo" (vitzoo's own layout), "timm" or "transformers" (that library's config keys and
        tensor names, refused for a model it cannot build), "auto" (timm's, else transformers', else
        vitzoo's); vitzoo loads each exactly (see vitzoo.checkpoints.layouts)."""
        self.check_describable("save")
        native.save_pretrained(self, directory, card=card, layout=format)

    def push_to_hub(self, repo_id: str, token: str | None = None, private: bool = False, revision: str | None = None,
                    commit_message: str = "Upload vitzoo model", **kwargs) -> str:
        """Upload what `save_pretrained` writes to the Hugging Face Hub repo `repo_id` (created when
        missing) as one commit; returns the commit URL. `format="auto"` (the default) writes timm's layout
        where timm builds the model (`timm.create_model("hf-hub:REPO", pretrained=True)` loads it), else
        transformers', else vitzoo's; `format="transformers"` writes one `ViTForImageClassification.
        from_pretrained` loads (refused, saying why, for a model it cannot build). See
        `vitzoo.checkpoints.publish.push_to_hub`."""
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
