"""Does kiln prune's importance pick the right FFN neurons? Half of every MiniLM layer's FFN cut three ways.

Before any recovery training, the bundled MiniLM loses half the neurons of every FFN layer, chosen by kiln's gate
score (kiln.compress.importance, measured on 512 docstring sentences), at random (two seeds), or by the largest
weight norm (|w_in| x |w_out| per neuron); the cosine of each pruned model's embedding to the original's is
measured on 300 held-out sentences of the reference manual.

    python benchmarks/prune_importance.py
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from kiln.compress import layout
from kiln.compress.importance import choose, measure
from kiln.compress.losses import pool
from kiln.data import corpus
from kiln.data.docstrings import docstring_sentences
from kiln.model.source import load_source


def main() -> None:
    torch.set_num_threads(2)
    source = load_source(None, "feature-extraction")
    model, tokenizer, config = source.model, source.tokenizer, source.task_config

    def batch(texts: list[str]) -> dict[str, torch.Tensor]:
        encoded = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        return {n: encoded[n] for n in source.input_names}

    held = batch(list(corpus.sentences("held-out"))[:300])

    def embed(m) -> torch.Tensor:
        with torch.no_grad():
            return pool(m(**held).last_hidden_state, held["attention_mask"], config)

    want = embed(model)
    train = sorted(docstring_sentences()[:512], key=len)
    scores = measure(model, (batch(train[i : i + 16]) for i in range(0, len(train), 16)),
                     output_names=("last_hidden_state",), embeds=True, config=config)
    width = layout.current_shape(model).ffn[0]
    choices = {"kiln importance": choose(scores.ffn, 0.5, scope="layer")}
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        choices[f"random (seed {seed})"] = tuple(tuple(sorted(rng.permutation(width)[: width // 2].tolist()))
                                               for _ in layout.layers(model))
    norms = []
    for layer in layout.layers(model):
        norm = layer.output.dense.weight.norm(dim=0) * layer.intermediate.dense.weight.norm(dim=1)
        norms.append(tuple(sorted(torch.argsort(norm, descending=True)[: width // 2].tolist())))
    choices["largest weight norm"] = tuple(norms)
    for name, keep in choices.items():
        pruned = copy.deepcopy(model)
        for layer, neurons in zip(layout.layers(pruned), keep, strict=True):
            layout.cut_ffn(pruned, layer, neurons)
        cosine = torch.nn.functional.cosine_similarity(embed(pruned), want, dim=-1)
        print(f"{name:>22}: mean cosine {cosine.mean():.4f}, min {cosine.min():.4f}", flush=True)


if __name__ == "__main__":
    main()
