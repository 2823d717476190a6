"""Attention masks kiln builds itself for families whose transformers code builds them in a way the exporter
cannot trace.

transformers 5 makes a bidirectional Gemma 3's masks (EmbeddingGemma: ``use_bidirectional_attention``) from mask
functions expanded with ``torch.vmap``, which the TorchScript-based ONNX exporter cannot trace ("unordered_map::at").
Its forward also accepts the masks ready-made, one per layer type, as ``generate`` passes them; kiln builds them
with plain tensor operations from the 2-D padding mask, in every engine alike (PyTorch reference included), and
tests/unit/test_masks.py checks them equal to transformers' own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MaskBuilder = Callable[[Any, Any, Any], dict[str, Any]]  # (config, 2-D padding mask, float dtype) -> masks by type


def _additive(allowed: Any, dtype: Any) -> Any:
    """0 where attention is allowed, the dtype's minimum elsewhere: transformers' eager mask convention. On the
    padding mask's device: made on the CPU, EmbeddingGemma's torch-fp16 failed on an H200 ("expected self and mask
    to be on the same device")."""
    import torch

    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed,
                                                                                      torch.finfo(dtype).min)


def bidirectional_window_masks(config: Any, attention_mask: Any, dtype: Any) -> dict[str, Any]:
    """A bidirectional Gemma 3's masks, [batch, 1, query, key]: full layers see every real token; sliding layers the
    real tokens less than ``sliding_window`` positions away on either side (transformers' overlay for it)."""
    import torch

    length = attention_mask.shape[1]
    real = attention_mask.bool()[:, None, None, :]  # [batch, 1, 1, key]
    position = torch.arange(length, device=attention_mask.device)
    near = (position[:, None] - position[None, :]).abs() < config.sliding_window  # [query, key]
    masks = {"full_attention": _additive(real.expand(-1, 1, length, -1), dtype),
             "sliding_attention": _additive(real & near[None, None], dtype)}
    return {kind: masks[kind] for kind in set(config.layer_types)}


def mask_builder(config: Any) -> MaskBuilder | None:
    """The builder for ``config``'s family, or None where transformers' own masks trace."""
    if getattr(config, "model_type", None) == "gemma3_text" and getattr(config, "use_bidirectional_attention", False):
        return bidirectional_window_masks
    return None
