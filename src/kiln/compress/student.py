"""A student built from its teacher by keeping some of its layers: every weight is copied, none re-initialised.

The layers of every model kiln supports live under a module list called ``layer``, ``layers`` or ``h`` (BERT,
RoBERTa, ELECTRA, MPNet, DeBERTa-v2: ``encoder.layer.N``; DistilBERT: ``transformer.layer.N``; ModernBERT:
``layers.N``; GPT-2 and GPT-Neo: ``transformer.h.N``), so keeping layers is renumbering those state-dict keys;
embeddings, head, pooler and anything else shared are copied as they are. ALBERT shares one layer's weights across
its depth: its student runs the same shared layer fewer times.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from kiln.errors import UsageError

LAYER_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?(?:layer|layers|h))\.(?P<index>\d+)\.(?P<rest>.*)$")
# Weights a student cannot take, by model type: ModernBERT's first layer has no pre-attention norm (the
# embeddings are normalised already), so a later teacher layer copied there leaves its attn_norm behind.
FIRST_LAYER_DROPS: dict[str, tuple[str, ...]] = {"modernbert": ("layers.0.attn_norm.",)}
# Config entries with one value per layer (ModernBERT's full/sliding attention pattern): kept for kept layers.
PER_LAYER_CONFIG = ("layer_types", "attention_layers")


def _gpt_neo_types(config: Any) -> None:
    """GPT-Neo rebuilds ``attention_layers`` from ``attention_types`` ([[kinds, repeats], ...]) when it is loaded:
    the student's must spell out its kept layers' kinds."""
    config.attention_types = [[list(config.attention_layers), 1]]


# Config entries derived from the per-layer ones, rewritten for the student by model type.
CONFIG_FIXES: dict[str, Any] = {"gpt_neo": _gpt_neo_types}


def depth(model: Any) -> int:
    return int(model.config.num_hidden_layers)


def evenly_spaced(teacher_depth: int, count: int) -> tuple[int, ...]:
    """``count`` layer indices spread over the teacher's depth, the first and the last always among them (the
    last layer's output is what the head and pooling were trained on)."""
    if not 1 <= count <= teacher_depth:
        raise UsageError(f"layers must be between 1 and the teacher's depth {teacher_depth} (got {count})")
    if count == 1:
        return (teacher_depth - 1,)
    return tuple(round(i * (teacher_depth - 1) / (count - 1)) for i in range(count))


def parse_keep_layers(text: str, teacher_depth: int) -> tuple[int, ...]:
    """``--keep-layers 0,2,4``: distinct indices of the teacher's layers, in order."""
    try:
        keep = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise UsageError(f"keep_layers takes comma-separated layer indices, e.g. 0,2,5 (got {text!r})") from err
    if not keep or any(not 0 <= i < teacher_depth for i in keep):
        raise UsageError(f"keep_layers: indices must be between 0 and {teacher_depth - 1} (the teacher has "
                         f"{teacher_depth} layers; got {text!r})")
    if len(set(keep)) != len(keep) or list(keep) != sorted(keep):
        raise UsageError(f"keep_layers: indices must be distinct and increasing (got {text!r})")
    return keep


def build_student(teacher: Any, keep: Sequence[int]) -> Any:
    """A model of the teacher's class and config with only the ``keep`` layers, their weights copied."""
    import torch

    position = {old: new for new, old in enumerate(keep)}
    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = len(keep)
    for name in PER_LAYER_CONFIG:
        values = getattr(config, name, None)
        if isinstance(values, (list, tuple)) and len(values) == depth(teacher):
            setattr(config, name, [values[i] for i in keep])
    fix = CONFIG_FIXES.get(getattr(config, "model_type", ""))
    if fix is not None:
        fix(config)
    with torch.device("cpu"):
        student = type(teacher)(config)
    shared = getattr(config, "model_type", "") == "albert"  # one layer's weights for the whole depth
    state = {}
    for key, value in teacher.state_dict().items():
        match = None if shared else LAYER_KEY.match(key)
        if match:
            index = int(match["index"])
            if index not in position:
                continue
            key = f"{match['prefix']}.{position[index]}.{match['rest']}"
        state[key] = value.detach().clone()
    drops = FIRST_LAYER_DROPS.get(getattr(config, "model_type", ""), ())
    state = {k: v for k, v in state.items() if not any(k.startswith(d) or f".{d}" in k for d in drops)}
    missing, unexpected = student.load_state_dict(state, strict=False)
    if missing or unexpected:  # a layout kiln does not know: refuse rather than train from random weights
        raise UsageError(f"cannot build a {len(keep)}-layer student of {type(teacher).__name__}: weights "
                         f"missing {list(missing)[:4]}, unexpected {list(unexpected)[:4]}")
    return student.eval()
