"""The distillation loop: length-grouped batches, teacher and student side by side, a checkpoint per epoch.

Why it is shaped this way (issue 11's naive baseline took 2.9 s per step and reached mean cosine 0.74):
- batches are cut from length-sorted features and only their order is shuffled, and features are cut at the
  recipe's ``max_length`` (default 128): a step costs what its texts cost, not 256 tokens of padding each;
- the student matches the teacher's hidden states layer by layer (each student layer against the teacher layer
  it was copied from) as well as the task outputs, far more signal per step than one vector per sentence;
- training runs without dropout and the batch order of an epoch depends only on (seed, epoch), so a run that
  resumes from an epoch's checkpoint ends with the weights an uninterrupted run ends with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kiln.compress.losses import IGNORE, hidden_states_loss, task_loss
from kiln.compress.recipe import CHECKPOINT, Epoch, Recipe
from kiln.errors import UsageError
from kiln.records.task import TaskConfig
from kiln.runtime.features import Prepared
from kiln.tasks.base import TaskSpec


@dataclass(frozen=True)
class Features:
    """Training features, prepared once: token arrays per feature and, where labelled, targets per output."""

    prepared: Prepared
    labels: dict[str, list[np.ndarray]]  # output name -> one target array per feature (IGNORE: no label)

    def __len__(self) -> int:
        return len(self.prepared.encodings)


def model_inputs(encoder: Any, encodings: Sequence[Any], input_names: Sequence[str]
                 ) -> tuple[dict[str, torch.Tensor], int]:
    """A padded batch of features as the model's keyword tensors, and its width in tokens."""
    arrays = encoder.collate(list(encodings))
    return {n: torch.from_numpy(arrays[n]).long() for n in input_names}, arrays["input_ids"].shape[1]


def batch_order(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Batches of similar length (cut from the length-sorted order), in an order fixed by (seed, epoch)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    np.random.default_rng([seed, epoch]).shuffle(batches)
    return batches


class Distiller:
    """Trains ``student`` to reproduce ``teacher`` on a task (both transformers models with the task's head)."""

    def __init__(self, teacher: Any, student: Any, spec: type[TaskSpec], config: TaskConfig, encoder: Any,
                 input_names: tuple[str, ...], recipe: Recipe, checkpoints: Path,
                 evaluate: Callable[[Any], tuple[float, dict[str, float]]],
                 report: Callable[[str, dict[str, Any]], None] = lambda kind, data: None) -> None:
        self.teacher, self.student = teacher.eval(), student.eval()  # no dropout: see the module doc
        self.spec, self.config, self.encoder = spec, config, encoder
        self.input_names, self.recipe = input_names, recipe
        self.checkpoints, self.evaluate, self.report = checkpoints, evaluate, report
        # student layer j (hidden_states[j + 1]) learns from the teacher layer it was copied from
        self.pairs = [(j + 1, t + 1) for j, t in enumerate(recipe.keep)]

    def _tensors(self, data: Features, index: np.ndarray) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        inputs, width = model_inputs(self.encoder, [data.prepared.encodings[i] for i in index], self.input_names)
        labels = {}
        for name, per_feature in data.labels.items():
            rows = [per_feature[i] for i in index]
            if rows[0].ndim == 0:
                labels[name] = torch.tensor(np.stack(rows), dtype=torch.long)
            else:  # per token: pad to the batch's width with IGNORE
                padded = np.full((len(rows), width), IGNORE, dtype=np.int64)
                for r, row in enumerate(rows):
                    padded[r, : len(row)] = row[:width]
                labels[name] = torch.from_numpy(padded)
        return inputs, labels

    def _step_loss(self, inputs: dict[str, torch.Tensor], labels: dict[str, torch.Tensor]) -> torch.Tensor:
        names = self.spec.export.output_names
        with torch.no_grad():  # not inference_mode: its tensors may not be saved for the student's backward
            teacher = self.teacher(**inputs, output_hidden_states=True, return_dict=True)
            t_states, t_out = teacher.hidden_states, {n: teacher[n] for n in names}
        student = self.student(**inputs, output_hidden_states=True, return_dict=True)
        mask = inputs["attention_mask"]
        loss = task_loss({n: student[n] for n in names}, t_out, mask, embeds=self.spec.embeds,
                         sequence_outputs=self.spec.export.sequence_outputs, config=self.config,
                         weights=self.recipe.weights, labels=labels or None)
        if self.recipe.weights.hidden > 0:
            loss = loss + self.recipe.weights.hidden * hidden_states_loss(student.hidden_states, t_states,
                                                                          self.pairs, mask)
        return loss

    def _optimizer(self, total_steps: int):
        recipe = self.recipe
        optimizer = torch.optim.AdamW(self.student.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        warmup = max(1, int(recipe.warmup * total_steps))

        def factor(step: int) -> float:  # linear warm-up, then linear decay to zero
            return min((step + 1) / warmup, max(0.0, (total_steps - step) / max(1, total_steps - warmup)))

        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def fit(self, data: Features, *, fingerprint: str, resume: bool = False) -> list[Epoch]:
        """Train for the recipe's epochs (stopping early without progress); the student ends with the weights
        of its best epoch on the held-out agreement. ``fingerprint`` (recipe + data) guards ``resume``."""
        recipe = self.recipe
        torch.manual_seed(recipe.seed)
        lengths = [len(e.ids) for e in data.prepared.encodings]
        steps_per_epoch = -(-len(data) // recipe.batch_size)
        optimizer, scheduler = self._optimizer(steps_per_epoch * recipe.epochs)
        history: list[Epoch] = []
        best_state, best, start_epoch = None, -float("inf"), 0
        if resume:
            start_epoch, history, best, best_state = self._restore(optimizer, scheduler, fingerprint)
        for epoch in range(start_epoch, recipe.epochs):
            if _stalled(history, recipe.patience):
                break
            begin, total, steps = time.perf_counter(), 0.0, 0
            for index in batch_order(lengths, recipe.batch_size, recipe.seed, epoch):
                inputs, labels = self._tensors(data, index)
                loss = self._step_loss(inputs, labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.student.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                total, steps = total + loss.item(), steps + 1
                self.report("step", {"epoch": epoch + 1, "step": steps, "steps": steps_per_epoch,
                                     "loss": total / steps})
            value, figures = self.evaluate(self.student)
            history.append(Epoch(epoch + 1, total / max(1, steps), value, figures, time.perf_counter() - begin,
                                 steps))
            if value > best:
                best, best_state = value, {k: v.detach().clone() for k, v in self.student.state_dict().items()}
            self._save(epoch + 1, optimizer, scheduler, history, best, best_state, fingerprint)
            self.report("epoch", asdict(history[-1]))
        if best_state is not None:
            self.student.load_state_dict(best_state)
        return history

    def _save(self, epoch: int, optimizer, scheduler, history: list[Epoch], best: float, best_state,
              fingerprint: str) -> None:
        """The state to go on from after ``epoch``, written atomically (a kill mid-write leaves the last one)."""
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        state = {"epoch": epoch, "student": self.student.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "history": [asdict(h) for h in history], "best": best,
                 "best_state": best_state, "fingerprint": fingerprint}
        tmp = self.checkpoints / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.checkpoints / CHECKPOINT)

    def _restore(self, optimizer, scheduler, fingerprint: str):
        path = self.checkpoints / CHECKPOINT
        if not path.is_file():
            raise UsageError(f"resume: no checkpoint at {path} (a run writes one after each epoch)")
        state = torch.load(path, weights_only=False)  # kiln's own file, written by _save above
        if state["fingerprint"] != fingerprint:
            raise UsageError(f"resume: the checkpoint at {path} was made with another recipe or other data; "
                             "run without --resume to start over")
        self.student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        self.report("resumed", {"epoch": state["epoch"], "path": str(path)})
        return state["epoch"], [Epoch(**h) for h in state["history"]], state["best"], state["best_state"]


def _stalled(history: list[Epoch], patience: int) -> bool:
    """True when none of the last ``patience`` epochs beat the best before them."""
    if len(history) <= patience:
        return False
    before = max(h.agreement for h in history[:-patience])
    return all(h.agreement <= before for h in history[-patience:])
