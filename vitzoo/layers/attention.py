"""Multi-head self-attention, the MSA of eq. (2).

q, k and v come from one fused projection (one matrix product instead of three). The attention is
PyTorch's fused kernel, `scaled_dot_product_attention`, or softmax(q k^T / sqrt(d) + bias) v written
out: for the attention maps, under torch.export with a bias, and in bfloat16 on the CPU, where it is
faster (`written_out_is_faster`). Written out in training, the backward pass recomputes the
probabilities from q and k, as the flash kernel does, unless the model stores them
(`VisionTransformer.set_attention_probabilities_stored`). A relative position bias, when the model
has one, enters as the additive mask of either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitzoo.config import ViTConfig
from vitzoo.errors import PluginError
from vitzoo.layers.init import xavier_uniform_blocks_
from vitzoo.tracing import fx_tracing


# Inference writes the attention out for at most this many logits at once (8 MiB in bf16): larger
# T x T tensors are mapped afresh by the C allocator at every call, at 2.3x timm's page faults.
CHUNK_LOGITS = 2**22


def written_out_is_faster(q: torch.Tensor) -> bool:
    """bfloat16 on the CPU: SDPA's flash kernel runs one small product per block of 64 queries; two
    batched products and a softmax were 1.1-1.3x faster in inference at ViT-S/16's and ViT-B/16's
    shapes, 1.9x in training. In float32, and on GPUs, the fused kernels are as fast or faster."""
    return q.device.type == "cpu" and q.dtype == torch.bfloat16


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

    def project(self, x: torch.Tensor, queries: int | None) -> tuple[torch.Tensor, ...]:
        """q, k and v, each (B, heads, tokens, head_dim); q of the first `queries` tokens only."""
        batch, tokens, dim = x.shape
        heads = (self.num_heads, self.head_dim)
        if queries is None:
            qkv = self.qkv(x).view(batch, tokens, 3, *heads)
            return qkv.permute(2, 0, 3, 1, 4)
        # the fused projection's rows are [q; k; v]: the queries from their tokens alone, k and v
        # from all (the query rows copied: a strided input rounds torch.func's product otherwise)
        weight, bias = self.qkv.weight, self.qkv.bias
        q = F.linear(x[:, :queries].contiguous(), weight[:dim], bias[:dim])
        kv = F.linear(x, weight[dim:], bias[dim:]).view(batch, tokens, 2, *heads)
        k, v = kv.permute(2, 0, 3, 1, 4)
        return q.view(batch, queries, *heads).transpose(1, 2), k, v

    def forward(self, x: torch.Tensor, grid: tuple[int, int], attn_maps: list | None = None,
                queries: int | None = None) -> torch.Tensor:
        """The attention output of every token, or of the first `queries` tokens (each attending to
        every token): (B, T or queries, D). `attn_maps` collects the probabilities."""
        q, k, v = self.project(x, queries)
        exporting = fx_tracing() or torch.compiler.is_exporting()  # one graph for any dtype

        def written_out(q, k, v, maps=None):  # the bias computed here: recomputed with the rest
            return self.softmax_attention(q, k, v, self.position_bias(q, grid), maps)

        if attn_maps is not None or (exporting and self.relative is not None):
            # torch.export mis-decomposes SDPA with a bias: there the attention is written out
            out = written_out(q, k, v, attn_maps)
        elif exporting or not written_out_is_faster(q):
            dropout = self.attn_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.position_bias(q, grid),
                                                 dropout_p=dropout)
        elif not q.requires_grad:
            step = max(1, CHUNK_LOGITS // (q.shape[1] * q.shape[2] * k.shape[2]))
            out = torch.cat([written_out(q[i : i + step], k[i : i + step], v[i : i + step])
                             for i in range(0, len(q), step)])
        elif self.store_probabilities or torch._C._are_functorch_transforms_active():
            out = written_out(q, k, v)  # torch.func runs no checkpoint hooks
        else:
            out = checkpoint(written_out, q, k, v, use_reentrant=False)
        return self.proj(out.transpose(1, 2).flatten(2))

    def position_bias(self, q: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor | None:
        """The relative position bias of these queries to every token, if the model has one."""
        if self.relative is None:
            return None
        bias = self.relative(q, grid)
        if not fx_tracing() and bias.shape[-2] != q.shape[2]:
            raise PluginError(
                f"the position embedding {type(self.relative).__name__} returned an attention bias "
                f"of shape {tuple(bias.shape)} for queries of shape {tuple(q.shape)}; an "
                "in-attention position embedding must return one row per query, (B or 1, heads, "
                "queries, tokens): the last block passes only the class token's queries when the "
                "pool reads nothing else (see vitzoo.hookspecs)")
        return bias

    def softmax_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          bias: torch.Tensor | None, attn_maps: list | None) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + bias) v, written out; the probabilities go to `attn_maps`."""
        logits = (q * self.head_dim**-0.5) @ k.contiguous().transpose(-2, -1)
        if bias is not None:
            logits = logits + bias
        probs = logits.softmax(dim=-1)
        if attn_maps is not None:
            attn_maps.append(probs.detach())
        return F.dropout(probs, self.attn_dropout, self.training) @ v
