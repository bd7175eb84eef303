"""Multi-head self-attention, the MSA of eq. (2).

q, k and v come from one fused projection (one matrix product instead of three). The attention is
`scaled_dot_product_attention`, except where that is slower (bfloat16 on the CPU: `explicit_is_faster`)
and when the caller wants the attention probabilities: there it is softmax(q k^T / sqrt(d)) v written
out, two batched matrix products and a softmax, as PyTorch's fused multi-head-attention inference
kernel (which torchvision's encoder uses) computes it; large inference batches a few images at a time
(`CHUNK_LOGITS`). In training the written-out form keeps no T x T tensor for the backward pass, which
recomputes the probabilities from q and k, as the flash kernel does (no more memory than it), unless
the model was asked to store them (`VisionTransformer.set_attention_probabilities_stored`: the memory
of every layer's probabilities, for a compiled step 0.5-3% faster in our runs). A relative
position bias, when the model has one, enters as the additive mask of either."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitzoo.config import ViTConfig
from vitzoo.errors import PluginError
from vitzoo.layers.init import xavier_uniform_blocks_
from vitzoo.tracing import fx_tracing, traced


def explicit_is_faster(q: torch.Tensor) -> bool:
    """Whether the written-out attention beats `scaled_dot_product_attention` for these queries.

    On the CPU in bfloat16, SDPA's flash kernel runs one small matrix product per block of 64 queries
    (ViT's 197 tokens make four blocks per head), each converting its tiles; two batched products and
    a softmax were 1.1-1.3x faster for the attention of ViT-S/16 and ViT-B/16 at batch 8 in inference,
    and 1.9x in training (forward and backward at ViT-S/16's shapes, batch 16), the probabilities
    recomputed in the backward pass as the flash kernel recomputes them. In float32 the flash kernel
    is as fast or faster (1.5x in training), and on GPUs SDPA's fused kernels win in every precision.
    """
    return q.device.type == "cpu" and q.dtype == torch.bfloat16


def in_torch_func() -> bool:
    """Whether a torch.func transform (grad, vjp, vmap of grad: per-sample gradients) is running. Its
    transforms do not support the saved-tensor hooks of a checkpoint: there the probabilities are stored."""
    return torch._C._are_functorch_transforms_active()


class Attention(nn.Module):
    def __init__(self, config: ViTConfig, relative: nn.Module | None = None) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.attn_dropout = config.attn_dropout
        self.qkv = nn.Linear(config.embed_dim, 3 * config.embed_dim)
        self.proj = nn.Linear(config.embed_dim, config.embed_dim)
        xavier_uniform_blocks_(self.qkv.weight, 3)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.qkv.bias)
        nn.init.zeros_(self.proj.bias)
        self.relative = relative  # a position embedding with in_attention=True, or None
        self.store_probabilities = False  # keep the written-out form's T x T probabilities for the backward pass

    def project(self, x: torch.Tensor, queries: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v, each (B, heads, tokens, head_dim); q only for the first `queries` tokens if given."""
        batch, tokens, dim = x.shape
        if queries is None:
            return self.qkv(x).view(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        # the fused projection's rows are [q; k; v]: the queries from their tokens alone, k and v from all
        # (those few rows copied: a strided input made torch.func's product round other than backward's)
        weight, bias = self.qkv.weight, self.qkv.bias
        q = F.linear(x[:, :queries].contiguous(), weight[:dim], bias[:dim]).view(batch, queries, self.num_heads, self.head_dim)
        k, v = F.linear(x, weight[dim:], bias[dim:]).view(batch, tokens, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q.transpose(1, 2), k, v

    def forward(
        self, x: torch.Tensor, grid: tuple[int, int], attn_maps: list[torch.Tensor] | None = None,
        queries: int | None = None,
    ) -> torch.Tensor:
        """The attention output of every token, or of the first `queries` tokens only (each still
        attending to every token): (B, T or queries, D)."""
        batch = x.shape[0]
        q, k, v = self.project(x, queries)
        if traced():
            # a graph for any batch and device (torch.fx, torch.export): no choice made on q's dtype or
            # size; a relative bias written out, as the exporter's SDPA-with-mask decomposition fails
            if self.relative is None and attn_maps is None:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout if self.training else 0.0)
            else:
                out = self.softmax_attention(q, k, v, grid, attn_maps)
        elif attn_maps is None and not explicit_is_faster(q):
            bias = self.position_bias(q, grid)
            dropout = self.attn_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
        elif attn_maps is None and not q.requires_grad and batch > (step := images_per_chunk(q, k)):
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
            for i in range(0, batch, step):
                self.softmax_attention(q[i : i + step], k[i : i + step], v[i : i + step], grid, out=out[i : i + step])
        elif attn_maps is None and q.requires_grad and not self.store_probabilities and not in_torch_func():
            # the backward pass recomputes the probabilities (and a relative position bias) from q and k,
            # as the flash kernel does, but whole rows at a time: no T x T tensor is kept for it, and
            # dropout draws the same mask again
            out = checkpoint(self.softmax_attention, q, k, v, grid, use_reentrant=False)
        else:
            out = self.softmax_attention(q, k, v, grid, attn_maps)
        return self.proj(out.transpose(1, 2).flatten(2))

    def position_bias(self, q: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor | None:
        """The relative position bias of these queries to every token, if the model has one."""
        if self.relative is None:
            return None
        bias = self.relative(q, grid)
        if not fx_tracing() and bias.shape[-2] != q.shape[2]:
            raise PluginError(
                f"the position embedding {type(self.relative).__name__} returned an attention bias of shape "
                f"{tuple(bias.shape)} for queries of shape {tuple(q.shape)}; an in-attention position embedding "
                "must return one row per query, (B or 1, heads, queries, tokens): the last block passes only "
                "the class token's queries when the pool reads nothing else (see vitzoo.hookspecs)"
            )
        return bias

    def softmax_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: tuple[int, int],
                          attn_maps: list[torch.Tensor] | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + the relative position bias, if any) v, written out."""
        # scaling q (T x d) costs less than scaling the logits (T x T); k is copied out of the fused
        # projection row by row, which costs less than the transposing copy the product would make
        logits = (q * self.head_dim**-0.5) @ k.contiguous().transpose(-2, -1)
        bias = self.position_bias(q, grid)
        if bias is not None:
            logits = logits + bias
        probs = logits.softmax(dim=-1)
        if attn_maps is not None:
            attn_maps.append(probs.detach())
        return torch.matmul(F.dropout(probs, self.attn_dropout, self.training), v, out=out)


# Inference writes the attention out for at most this many logits at once (8 MiB in bf16): a ViT-B/16
# batch of 8 in one go, a batch of 32 in four chunks. All 32 at once made two 30 MB T x T tensors per
# layer, which the C allocator maps afresh at every call: 2.3x the page faults of timm's forward pass.
CHUNK_LOGITS = 2**22


def images_per_chunk(q: torch.Tensor, k: torch.Tensor) -> int:
    heads, queries, tokens = q.shape[1], q.shape[2], k.shape[2]
    return max(1, CHUNK_LOGITS // (heads * queries * tokens))
