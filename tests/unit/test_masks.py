"""kiln's own attention masks for a bidirectional Gemma 3 (EmbeddingGemma) equal transformers' own, which the ONNX
exporter cannot trace: full layers see every real token, sliding layers the real tokens within the window."""

from __future__ import annotations

import torch
import transformers
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.models.gemma3.modeling_gemma3 import _bidirectional_window_overlay

from kiln.model.masks import bidirectional_window_masks, mask_builder


def _config(bidirectional: bool = True) -> transformers.Gemma3TextConfig:
    config = transformers.Gemma3TextConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        intermediate_size=32, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention=bidirectional)
    config._attn_implementation = "eager"
    return config


def test_bidirectional_gemma3_masks_equal_transformers_own():
    config = _config()
    mask = torch.tensor([[1] * 11, [1] * 6 + [0] * 5, [0] * 3 + [1] * 8])  # right- and left-padded rows
    embeds = torch.zeros(3, 11, 16)
    kwargs = {"config": config, "inputs_embeds": embeds, "attention_mask": mask, "past_key_values": None,
              "position_ids": torch.arange(11)[None]}
    want = {"full_attention": create_causal_mask(**kwargs, or_mask_function=lambda *a: torch.tensor(True)),
            "sliding_attention": create_sliding_window_causal_mask(
                **kwargs, or_mask_function=_bidirectional_window_overlay(config.sliding_window))}
    got = bidirectional_window_masks(config, mask, torch.float32)
    assert set(got) == set(want)
    for kind in want:
        torch.testing.assert_close(got[kind], want[kind], rtol=0, atol=0)
    assert mask_builder(config) is bidirectional_window_masks
    assert mask_builder(_config(bidirectional=False)) is None  # a causal Gemma 3: transformers' masks trace


def test_the_masks_are_made_on_the_padding_masks_device():
    """On a GPU the padding mask is on cuda; a mask made on the CPU failed there. The meta device stands in for
    any device but the CPU (its tensors have shapes and no data)."""
    mask = torch.ones(2, 7, dtype=torch.long, device="meta")
    masks = bidirectional_window_masks(_config(), mask, torch.float32)
    assert {m.device.type for m in masks.values()} == {"meta"}
    assert all(m.shape == (2, 1, 7, 7) for m in masks.values())
