"""The decoding step as one graph: token ids, the attention mask over past + new tokens, their positions and the
past keys/values in; logits and the grown keys/values out.

One graph serves every step: on the first the past is empty (length 0), afterwards it holds what the previous step
returned, so export, validation and generation all run the same function (what Optimum's single decoder model
does). The 4-D attention mask is built inside the graph from the 2-D one with tensor arithmetic only: transformers'
own mask helpers read the cache length as a Python int, which the tracer would freeze at the example's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

INPUT_IDS, ATTENTION_MASK, POSITION_IDS = "input_ids", "attention_mask", "position_ids"
LOGITS = "logits"
# The fused step graph's (kiln.exporting.fused_decoder) instead of a mask: each row's tokens - 1, and the longest row's;
# and which of each row's new positions get logits (a prefill for generation needs only the last one's).
SEQLENS_K, TOTAL_LENGTH, LOGITS_AT = "seqlens_k", "total_sequence_length", "logits_positions"
PAST_PREFIX = "past_key_values."  # + layer + ".key" or ".value": one input per layer and kind


@dataclass(frozen=True)
class CacheShape:
    """What one sequence's KV cache looks like: per layer a key and a value of [heads, length, head size].
    ``heads`` are the key/value heads: with grouped-query attention (Llama, Qwen3, Gemma 3) fewer than the query
    heads, and the cache holds only those."""

    layers: int
    heads: int
    head_size: int

    @classmethod
    def of(cls, config: Any) -> CacheShape:
        query_heads = int(config.num_attention_heads)
        heads = int(getattr(config, "num_key_value_heads", None) or query_heads)
        # Qwen3 and Gemma 3 set head_dim apart from hidden_size / heads (Qwen3-0.6B: 16 x 128 over 1,024).
        head_size = int(getattr(config, "head_dim", None) or int(config.hidden_size) // query_heads)
        return cls(int(config.num_hidden_layers), heads, head_size)

    def past_names(self) -> tuple[str, ...]:
        return tuple(f"{PAST_PREFIX}{i}.{kind}" for i in range(self.layers) for kind in ("key", "value"))

    def present_names(self) -> tuple[str, ...]:
        return tuple(f"present.{i}.{kind}" for i in range(self.layers) for kind in ("key", "value"))

    def empty(self, batch: int) -> dict[str, np.ndarray]:
        """The first step's past: zero tokens long."""
        return {n: np.zeros((batch, self.heads, 0, self.head_size), np.float32) for n in self.past_names()}

    def to_dict(self) -> dict[str, int]:
        return {"layers": self.layers, "heads": self.heads, "head_size": self.head_size}


def graph_inputs(shape: CacheShape) -> tuple[str, ...]:
    return (INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *shape.past_names())


def graph_outputs(shape: CacheShape) -> tuple[str, ...]:
    return (LOGITS, *shape.present_names())


def dynamic_axes(shape: CacheShape) -> dict[str, dict[int, str]]:
    axes = {INPUT_IDS: {0: "batch", 1: "sequence"}, POSITION_IDS: {0: "batch", 1: "sequence"},
            ATTENTION_MASK: {0: "batch", 1: "total_sequence"}, LOGITS: {0: "batch", 1: "sequence"}}
    axes.update({n: {0: "batch", 2: "past_sequence"} for n in shape.past_names()})
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in shape.present_names()})
    return axes


def positions(attention_mask: np.ndarray, new: int) -> np.ndarray:
    """Position ids of the last ``new`` columns: real tokens count from 0 (left padding does not shift them);
    padding gets 1, as transformers' generate gives it."""
    pos = np.cumsum(attention_mask, axis=1) - 1
    pos[attention_mask == 0] = 1
    return np.ascontiguousarray(pos[:, attention_mask.shape[1] - new:], dtype=np.int64)


def make_decoder_module(model: Any):
    """A torch module over ``model`` (a transformers causal LM) with positional inputs ``graph_inputs``."""
    import torch
    from transformers import DynamicCache

    shape = CacheShape.of(model.config)
    window = sliding_window(model.config)

    class DecoderModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.input_names = graph_inputs(shape)
            self.output_names = graph_outputs(shape)
            self.eval()  # exporters restore the training flag they found; False keeps dropout off afterwards

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(shape.layers)])
            mask = causal_mask(input_ids, attention_mask)
            if window:  # per layer type, as the model takes them: its sliding layers see the last ``window`` slots
                mask = {"full_attention": mask, "sliding_attention": causal_mask(input_ids, attention_mask, window)}
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True, return_dict=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return DecoderModule()


def sliding_window(config: Any) -> int | None:
    """The window of a model whose layers take a mask per type (Gemma 3: ``layer_types`` with sliding layers), or
    None: one mask for every layer (GPT-Neo's config has no ``layer_types``; its local layers window themselves)."""
    types = getattr(config, "layer_types", None) or ()
    return int(config.sliding_window) if "sliding_attention" in types else None


def causal_mask(input_ids, attention_mask, window: int | None = None):
    """[batch, 1, new, past + new] additive mask: a new token sees real tokens up to its own position (and, with a
    ``window``, only keys in the last ``window`` cache slots, its own included, as transformers' sliding layers;
    kiln's padding is all on the left, so that is the row's last ``window`` tokens, as for the text alone)."""
    import torch

    total = torch.ones_like(attention_mask[0]).sum()
    new = torch.ones_like(input_ids[0]).sum()
    key_at = torch.ones_like(attention_mask[:1]).cumsum(-1) - 1  # [1, total]
    query_at = torch.ones_like(input_ids[:1]).cumsum(-1) - 1 + (total - new)  # [1, new]
    before = key_at[:, None, :] <= query_at[:, :, None]
    if window:
        before = before & (key_at[:, None, :] > query_at[:, :, None] - window)
    allowed = before[:, None] & attention_mask[:, None, None, :].bool()
    zeros = torch.zeros(allowed.shape, dtype=torch.float32, device=input_ids.device)
    return zeros.masked_fill(~allowed, torch.finfo(torch.float32).min)
