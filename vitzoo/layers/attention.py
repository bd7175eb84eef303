"""Multi-head self-attention, the MSA of eq. (2).

q, k and v come from one fused projection (one matrix product instead of three). The attention is
`scaled_dot_product_attention`, except in bfloat16 on the CPU where it is slower (`explicit_is_faster`)
and when the caller wants the attention probabilities: there it is softmax(q k^T / sqrt(d)) v written out, two
batched matrix products and a softmax, as PyTorch's fused multi-head-attention inference kernel
(which torchvision's encoder uses) computes it. A relative position bias, when the model has one,
enters as the additive mask of either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitzoo.config import ViTConfig
from vitzoo.layers.init import xavier_uniform_blocks_


def explicit_is_faster(q: torch.Tensor, embed_dim: int) -> bool:
    """Whether the written-out attention beats `scaled_dot_product_attention` for these queries.

    On the CPU in bfloat16, SDPA's flash kernel runs one small matrix product per block of 64 queries
    (ViT's 197 tokens make four blocks per head), each converting its tiles; two batched products and
    a softmax were 1.1-1.3x faster for the attention of ViT-S/16 and ViT-B/16 at batch 8 in inference,
    and 2.5x in a training step (forward and backward), while in float32 the flash kernel is as fast
    or faster. On GPUs SDPA's fused kernels win in every precision.

    In training the written-out form keeps the T x T probabilities of every layer for the backward pass,
    which the flash kernel never stores: eager training keeps the flash kernel (a ViT-S/16 bf16 step at
    batch 16 peaked 6% higher than timm's with the probabilities). Compiled training
    (`vitzoo.fast.compile_for_training`) holds fewer other activations, as Inductor fuses the
    element-wise work, and takes the written-out form as long as the probabilities of a token (heads x T
    values) are at most four times its embedding (ViT-S/16 and B/16 at 224 px: 3.1x; at 384 px, 577
    tokens: 9x): the compiled ViT-S/16 bf16 step ran 1.2x faster than with the flash kernel.
    """
    if q.device.type != "cpu" or q.dtype != torch.bfloat16:
        return False
    if not q.requires_grad:
        return True
    heads, tokens = q.shape[1], q.shape[2]
    return torch.compiler.is_compiling() and heads * tokens <= 4 * embed_dim


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

    def forward(
        self, x: torch.Tensor, grid: tuple[int, int], attn_maps: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        bias = self.relative(q, grid) if self.relative is not None else None
        dropout = self.attn_dropout if self.training else 0.0
        if attn_maps is None and not explicit_is_faster(q, dim):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
        else:
            # scaling q (T x d) costs less than scaling the logits (T x T); k is copied out of the fused
            # projection row by row, which costs less than the transposing copy the product would make
            logits = (q * self.head_dim**-0.5) @ k.contiguous().transpose(-2, -1)
            if bias is not None:
                logits = logits + bias
            probs = logits.softmax(dim=-1)
            if attn_maps is not None:
                attn_maps.append(probs.detach())
            out = F.dropout(probs, self.attn_dropout, self.training) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))
