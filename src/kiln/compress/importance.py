"""How much each attention head and FFN neuron matters, measured on data through gates.

Every head and every neuron gets a gate, a factor 1.0 on its slice of the input of the layer's output
projection (the concatenated heads before the attention output linear; the activations before the second FFN
linear). The gradient of a loss with respect to a gate is the first-order change of that loss when the head or
neuron is removed (gate 0): "Are Sixteen Heads Really Better than One?" (Michel et al., 2019) for heads; for a
neuron it equals activation x gradient summed over tokens. Summing the squared gradients over batches gives the
Fisher-style score of Kwon et al. (2022), which does not cancel between examples the way a signed mean does.

The loss is the model's *output sensitivity*: the outputs the task compares (the pooled sentence embedding, or
the logits) projected on a fixed random direction per batch. Its squared gradient estimates, in expectation,
the squared change of the outputs when a gate closes, which is what agreement with the unpruned model suffers.
(A distillation loss against the unpruned model itself has zero gradient before anything is removed, and
labels are not needed for this.) Scores are normalised per layer (Michel et al.), then ranked across layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kiln.compress.losses import pool
from kiln.model import layout as shapes
from kiln.records.task import TaskConfig


@dataclass(frozen=True)
class Importance:
    heads: tuple[np.ndarray, ...]  # per layer, one score per current head
    ffn: tuple[np.ndarray, ...]  # per layer, one score per current neuron
    batches: int


class _Gates:
    """A gate of ones per head and per neuron of each layer, multiplied into the output projections' inputs."""

    def __init__(self, model: Any) -> None:
        self.layers = shapes.layers(model)
        lay = shapes.layout(model)
        self.head = [torch.ones(shapes.heads_of(model, layer), requires_grad=True) for layer in self.layers]
        self.ffn = [torch.ones(shapes.ffn_of(model, layer), requires_grad=True) for layer in self.layers]
        self.dims = [shapes.head_dim(model, layer) for layer in self.layers]
        self.handles = []
        for i, layer in enumerate(self.layers):
            self.handles.append(shapes.module_at(layer, lay.attention_out).register_forward_pre_hook(self._heads(i)))
            self.handles.append(shapes.module_at(layer, lay.ffn_out).register_forward_pre_hook(self._neurons(i)))

    def _heads(self, i: int) -> Callable:
        def hook(module, args):
            return (args[0] * self.head[i].repeat_interleave(self.dims[i]), *args[1:])
        return hook

    def _neurons(self, i: int) -> Callable:
        def hook(module, args):
            return (args[0] * self.ffn[i], *args[1:])
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def sensitivity(outputs: dict[str, torch.Tensor], mask: torch.Tensor, *, embeds: bool, config: TaskConfig,
                generator: torch.Generator, sequence_outputs: frozenset[str] = frozenset()) -> torch.Tensor:
    """Outputs the task compares, projected on a random direction (see the module doc); padding left out."""
    total = torch.zeros(())
    for name, value in outputs.items():
        if embeds:
            value = pool(value, mask, config)
        elif value.dim() == 3:  # per-token logits
            value = value * mask.unsqueeze(-1).to(value.dtype)
        elif name in sequence_outputs:  # a score per position (QA start/end)
            value = value * mask.to(value.dtype)
        direction = torch.randn(value.shape, generator=generator)
        total = total + (value * direction).sum()
    return total


def measure(model: Any, batches: Iterable[dict[str, torch.Tensor]], *, output_names: tuple[str, ...],
            embeds: bool, config: TaskConfig, seed: int = 0, sequence_outputs: frozenset[str] = frozenset(),
            progress: Callable[[int], None] = lambda done: None) -> Importance:
    """Scores of every head and neuron of ``model`` over ``batches`` (model inputs), normalised per layer."""
    gates = _Gates(model)
    generator = torch.Generator().manual_seed(seed)
    head_scores = [torch.zeros_like(g) for g in gates.head]
    ffn_scores = [torch.zeros_like(g) for g in gates.ffn]
    count = 0
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)  # only the gates need gradients
    try:
        for inputs in batches:
            out = model(**inputs, return_dict=True)
            loss = sensitivity({n: out[n] for n in output_names}, inputs["attention_mask"], embeds=embeds,
                               config=config, generator=generator, sequence_outputs=sequence_outputs)
            grads = torch.autograd.grad(loss, [*gates.head, *gates.ffn], allow_unused=True)
            for score, grad in zip([*head_scores, *ffn_scores], grads, strict=True):
                if grad is not None:
                    score += grad.detach() ** 2
            count += 1
            progress(count)
    finally:
        gates.remove()
        for p in model.parameters():
            p.requires_grad_(True)
    return Importance(tuple(_normalised(s) for s in head_scores), tuple(_normalised(s) for s in ffn_scores), count)


def _normalised(score: torch.Tensor) -> np.ndarray:
    values = score.sqrt().numpy().astype(np.float64)  # root of the summed squares: the scale of a gradient
    norm = np.linalg.norm(values)
    return values / norm if norm > 0 else values


def choose(scores: tuple[np.ndarray, ...], fraction: float, *, scope: str, minimum: int = 1
           ) -> tuple[tuple[int, ...], ...]:
    """Indices to keep per layer after removing ``fraction`` of all units with the lowest scores: ranked
    across layers (``global``) or the same share in each layer (``layer``); each layer keeps ``minimum``."""
    sizes = [len(s) for s in scores]
    if fraction <= 0:
        return tuple(tuple(range(n)) for n in sizes)
    if scope == "layer":
        removes = [min(n - minimum, int(round(n * fraction))) for n in sizes]
        return tuple(tuple(sorted(np.argsort(s, kind="stable")[r:].tolist())) for s, r in zip(scores, removes,
                                                                                                 strict=True))
    total = int(round(sum(sizes) * fraction))
    ranked = sorted(((float(v), layer, i) for layer, s in enumerate(scores) for i, v in enumerate(s)))
    removed: list[set[int]] = [set() for _ in sizes]
    for _, layer, i in ranked:
        if total == 0:
            break
        if sizes[layer] - len(removed[layer]) > minimum:
            removed[layer].add(i)
            total -= 1
    return tuple(tuple(i for i in range(n) if i not in removed[layer]) for layer, n in enumerate(sizes))
