"""kiln prune: remove the least important attention heads and FFN neurons physically, then recover by
distillation from the unpruned model.

Importance is measured on the training texts through gates (kiln/compress/importance.py), the chosen heads and
neurons are cut out of the weight matrices (kiln/compress/layout.py), and the pruned model is trained to
reproduce the unpruned one (every layer's hidden states and the task outputs) for ``--recover-epochs``. The
rest (data, held-out agreement, checkpoints, resume, the written directory) is kiln distill's
(kiln/compress/distill.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.choices import PruneScope, parse_choice
from kiln.compress.distill import DistillConfig, DistillResult, Student, StudentMaker, run_compression
from kiln.compress.importance import choose, measure
from kiln.compress.recipe import Recipe
from kiln.compress.trainer import Features, model_inputs
from kiln.errors import UsageError
from kiln.model import layout as shapes

# Recovery starts next to the unpruned model, so it takes smaller steps than a student built from layers
# (kiln distill's 5e-4). Not swept; see benchmarks/RESULTS.md for what it reached.
RECOVERY_LR = 1e-4


@dataclass(frozen=True)
class PruneSettings:
    heads: float = 0.0  # share of all attention heads to remove
    ffn: float = 0.0  # share of all FFN neurons to remove
    scope: PruneScope = PruneScope.GLOBAL  # rank across layers, or remove the same share in every layer
    samples: int = 512  # training features the importance is measured on
    batch_size: int = 16

    def __post_init__(self) -> None:
        for flag, value in (("heads", self.heads), ("ffn", self.ffn)):
            if not 0 <= value < 1:
                raise UsageError(f"{flag} is the share to remove, at least 0 and below 1 (got {value})")
        if self.heads == 0 and self.ffn == 0:
            raise UsageError("nothing to prune: give --heads and/or --ffn (shares to remove, e.g. --ffn 0.25)")
        object.__setattr__(self, "scope", parse_choice(PruneScope, self.scope, "scope"))
        if self.samples < 1:
            raise UsageError(f"importance_samples must be at least 1 (got {self.samples})")


def pruned_student(settings: PruneSettings, seed: int) -> StudentMaker:
    def make(source, features: Features, encoder, progress: Callable[[str, dict[str, Any]], None]) -> Student:
        from kiln.source.loading import parameter_count

        model = copy.deepcopy(source.model)
        shape, kept_ffn, scores = prune_in_place(model, source, features, encoder, settings, seed, progress)
        params = parameter_count(model)
        lineage = {"layers": len(shape.heads), "keep_layers": list(range(len(shape.heads))),
                   "pruning": {"heads": settings.heads, "ffn": settings.ffn, "scope": settings.scope,
                               "importance_samples": scores, "shape": shape.to_json(),
                               "kept_ffn_neurons": [list(k) for k in kept_ffn],
                               "stored_as": shapes.CONFIG_KEY if hasattr(model.config, shapes.CONFIG_KEY)
                               else "transformers config"}}
        progress("pruned", {"shape": shape, "parameters": params,
                            "teacher_parameters": parameter_count(source.model)})
        return Student(model, tuple(range(len(shape.heads))), lineage)

    return StudentMaker("prune", {"heads": settings.heads, "ffn": settings.ffn, "scope": settings.scope,
                                  "samples": settings.samples, "batch_size": settings.batch_size}, make)


def prune_in_place(model: Any, source, features: Features, encoder, settings: PruneSettings, seed: int,
                   progress: Callable[[str, dict[str, Any]], None]
                   ) -> tuple[shapes.Shape, tuple[tuple[int, ...], ...], int]:
    """Measure importance on up to ``settings.samples`` features and cut ``model`` in place: (its shape, the
    teacher's FFN neurons kept per layer, the number of features measured)."""
    from kiln.tasks import task_spec

    spec = task_spec(source.task_config.task)
    encodings = features.prepared.encodings
    chosen = np.sort(np.random.default_rng(seed).permutation(len(encodings))[: settings.samples])
    chosen = chosen[np.argsort([len(encodings[i].ids) for i in chosen], kind="stable")]  # cheap batches
    batches = [chosen[i : i + settings.batch_size] for i in range(0, len(chosen), settings.batch_size)]
    tensors = (model_inputs(encoder, [encodings[i] for i in index], source.input_names)[0] for index in batches)
    importance = measure(model, tensors, output_names=spec.export.output_names, embeds=spec.embeds,
                         config=source.task_config, seed=seed, sequence_outputs=spec.export.sequence_outputs,
                         progress=lambda done: progress("importance", {"done": done, "total": len(batches)}))
    keep_heads = choose(importance.heads, settings.heads, scope=settings.scope)
    keep_ffn = choose(importance.ffn, settings.ffn, scope=settings.scope)
    before = shapes.current_shape(model)
    for layer, heads, neurons, now in zip(shapes.layers(model), keep_heads, keep_ffn, before.heads, strict=True):
        if len(heads) < len(now):
            shapes.cut_heads(model, layer, heads)
        if len(neurons) < shapes.ffn_of(model, layer):
            shapes.cut_ffn(model, layer, neurons)
    shape = shapes.Shape(tuple(tuple(now[i] for i in heads) for heads, now in zip(keep_heads, before.heads,
                                                                                   strict=True)),
                         tuple(len(n) for n in keep_ffn))
    shapes.record(model, shape)
    return shape, keep_ffn, len(chosen)


def run_prune(config: DistillConfig, settings: PruneSettings,
              progress: Callable[[str, dict[str, Any]], None] = lambda kind, data: None) -> DistillResult:
    seed = Recipe(keep=(), **config.recipe).seed  # the recipe's own default when none is given
    return run_compression(config, pruned_student(settings, seed), progress)
