"""Distillation losses: what the student is trained to reproduce of its teacher.

Embedding tasks: the sentence embedding (the task's pooling, normalised where the model normalises) by cosine,
plus MSE between hidden states of matched layers (student layer j against the teacher layer it was copied from),
which carries far more signal per step than one vector per sentence. Logit tasks: temperature-softened KL per
output (every token of a sequence output, padding masked), mixed with cross-entropy on labels where given:
``alpha * CE + (1 - alpha) * T^2 * KL``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from kiln.choices import Pooling
from kiln.compress.recipe import LossWeights
from kiln.records.task import TaskConfig
from kiln.tasks.validation import NO_LABEL as IGNORE


def pool(hidden: torch.Tensor, mask: torch.Tensor, config: TaskConfig) -> torch.Tensor:
    """The sentence embedding as the task computes it (kiln/tasks/feature_extraction.py), in torch."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if config.pooling == Pooling.CLS:
        pooled = hidden[:, 0]
    elif config.pooling == Pooling.MAX:
        pooled = hidden.masked_fill(weights == 0, float("-inf")).amax(dim=1)
    else:
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    return F.normalize(pooled, dim=-1) if config.normalize else pooled


def hidden_states_loss(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor],
                       pairs: Sequence[tuple[int, int]], mask: torch.Tensor) -> torch.Tensor:
    """Mean over ``pairs`` (student index, teacher index) of the masked MSE between hidden states."""
    weights = mask.unsqueeze(-1).to(student[0].dtype)
    count = weights.sum() * student[0].shape[-1]
    losses = [(((student[s] - teacher[t]) ** 2) * weights).sum() / count for s, t in pairs]
    return torch.stack(losses).mean()


def embedding_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor,
                   config: TaskConfig) -> torch.Tensor:
    return (1 - F.cosine_similarity(pool(student, mask, config), pool(teacher, mask, config), dim=-1)).mean()


def logits_loss(student: torch.Tensor, teacher: torch.Tensor, weights: LossWeights, *,
                token_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
    """KL between temperature-softened distributions over the last axis (rows where ``token_mask`` is 0 left
    out), plus cross-entropy on ``labels`` (class per row, NO_LABEL for none) with weight ``alpha``."""
    t = weights.temperature
    classes = student.shape[-1]
    s, te = student.reshape(-1, classes), teacher.reshape(-1, classes)
    kl = F.kl_div(F.log_softmax(s / t, dim=-1), F.log_softmax(te / t, dim=-1), log_target=True,
                  reduction="none").sum(-1)
    keep = token_mask.reshape(-1).to(kl.dtype) if token_mask is not None else torch.ones_like(kl)
    distill = t * t * (kl * keep).sum() / keep.sum().clamp(min=1)
    if labels is None or weights.alpha == 0 or not (labels != IGNORE).any():
        return distill
    ce = F.cross_entropy(s, labels.reshape(-1), ignore_index=IGNORE)
    return weights.alpha * ce + (1 - weights.alpha) * distill


def _padded_positions_out(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A distribution over positions (QA start/end) must not put mass on padding."""
    return logits.masked_fill(mask == 0, torch.finfo(logits.dtype).min / 2)


def task_loss(student: Mapping[str, torch.Tensor], teacher: Mapping[str, torch.Tensor], mask: torch.Tensor, *,
              embeds: bool, sequence_outputs: frozenset[str], config: TaskConfig, weights: LossWeights,
              labels: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The loss on the task's outputs (by name, as the task spec lists them)."""
    if embeds:
        (name,) = student
        return weights.embedding * embedding_loss(student[name], teacher[name], mask, config)
    parts = []
    for name in student:
        s, t, target = student[name], teacher[name], (labels or {}).get(name)
        if s.dim() == 3:  # a distribution over classes at every token: padding tokens left out
            parts.append(logits_loss(s, t, weights, token_mask=mask, labels=target))
        elif name in sequence_outputs:  # one distribution over the positions of each sequence (QA start/end)
            parts.append(logits_loss(_padded_positions_out(s, mask), _padded_positions_out(t, mask), weights,
                                     labels=target))
        else:  # one distribution over classes per sequence
            parts.append(logits_loss(s, t, weights, labels=target))
    return torch.stack(parts).mean()
