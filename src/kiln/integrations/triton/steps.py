"""The Python-backend steps of a kiln Triton ensemble: tokenize, run the model (CPU), post-process.

Each generated ``model.py`` is one line, ``from kiln.integrations.triton.steps import X as TritonPythonModel``;
the step reads ``kiln_step.json`` beside it (the artifact directory, padding buckets). The tokenizer step pads
every request to a bucket length so Triton's batcher, which merges only requests of one shape, can batch
mixed-length traffic; the post step runs the task spec's own ``reduce`` and ``finalize``, so Triton answers
exactly what ``kiln.load(...).predict`` does. No torch is imported by any step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

STEP_FILE = "kiln_step.json"


class _Step:
    """What every step shares: its settings and its copy of the artifact, read when Triton loads the model."""

    def _open(self, args: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        from kiln.artifact.directory import Artifact
        from kiln.tasks import task_handler, task_spec
        from kiln.tasks.wire import task_wire

        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / STEP_FILE).read_text())
        artifact = Artifact.open(version_dir / settings["artifact"], check=False)
        self.spec = task_spec(artifact.task_config.task)
        self.handler = task_handler(artifact.task_config)
        self.wire = task_wire(artifact.task_config.task)
        return settings, artifact

    def finalize(self) -> None:
        return


def _strings(request: Any, name: str) -> list[str]:
    import triton_python_backend_utils as pb_utils

    raw = pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in raw]


def _items(wire: Any, request: Any) -> list[Any]:
    """The task's inputs of one request (one per batch row), from its string tensors."""
    return wire.triton_items({name: _strings(request, name) for name in wire.triton_inputs})


def bucket(length: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``length`` tokens (the largest bucket is the model's maximum)."""
    return next((b for b in buckets if b >= length), buckets[-1])


class TokenizeStep(_Step):
    """The task's inputs -> input ids, attention mask (and token types), padded to a length bucket.

    With windows (QA), each row's windows go on an axis after the batch axis, padded with empty windows
    (attention mask all zero) to the row with the most."""

    def initialize(self, args: dict[str, Any]) -> None:
        settings, artifact = self._open(args)
        self.encoder = artifact.encoder()
        self.buckets = sorted(settings["buckets"])

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            items = _items(self.wire, request)
            prepared = self.handler.features(items, self.encoder)
            width = bucket(max(len(e.ids) for e in prepared.encodings), self.buckets)
            arrays = self.encoder.collate(prepared.encodings, multiple=width)  # every row exactly the bucket
            arrays = {name: a[:, :width] for name, a in arrays.items()}
            if self.wire.triton_windows:
                arrays = _by_owner(arrays, prepared.owners, len(items))
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.ascontiguousarray(a, dtype=np.int64)) for name, a in arrays.items()]))
        return responses


def _by_owner(arrays: dict[str, np.ndarray], owners: tuple[int, ...], rows: int) -> dict[str, np.ndarray]:
    """[features, L] -> [rows, most windows, L]: each input's windows in order, empty windows after."""
    counts = np.bincount(np.asarray(owners), minlength=rows)
    out = {name: np.zeros((rows, int(counts.max()), a.shape[1]), dtype=a.dtype) for name, a in arrays.items()}
    slot = [0] * rows
    for feature, owner in enumerate(owners):
        for name, a in arrays.items():
            out[name][owner, slot[owner]] = a[feature]
        slot[owner] += 1
    return out


class ModelStep(_Step):
    """The artifact's engine (ONNX Runtime or OpenVINO on the CPU): Triton's batch of requests in one run."""

    def initialize(self, args: dict[str, Any]) -> None:
        settings, artifact = self._open(args)
        self.engine = artifact.engine(options=artifact.serving_plan(threads=settings.get("threads")).options)
        self.engine.warmup()
        self.per_token = self.spec.export.sequence_outputs

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        feeds = [{name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.engine.input_names}
                 for r in requests]
        shapes = [f["input_ids"].shape for f in feeds]
        if self.wire.triton_windows:  # [rows, windows, L] -> [rows * windows, L]: windows run as one engine batch
            feeds = [{n: a.reshape(-1, a.shape[-1]) for n, a in f.items()} for f in feeds]
        rows = [f["input_ids"].shape[0] for f in feeds]
        width = max(f["input_ids"].shape[1] for f in feeds)
        batch = {name: np.concatenate([np.pad(f[name], ((0, 0), (0, width - f[name].shape[1]))) for f in feeds])
                 for name in self.engine.input_names}
        outputs = self.engine.run(batch)
        responses, start = [], 0
        for feed, count, shape in zip(feeds, rows, shapes):
            length = feed["input_ids"].shape[1]
            tensors = []
            for name in self.engine.output_names:
                part = outputs[name][start : start + count]
                if name in self.per_token:  # back to this request's own (bucket) length
                    part = part[:, :length]
                if self.wire.triton_windows:
                    part = part.reshape(*shape[:2], *part.shape[1:])
                tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(part, dtype=np.float32)))
            responses.append(pb_utils.InferenceResponse(tensors))
            start += count
        return responses


class PostStep(_Step):
    """Model outputs + attention mask (+ the request's strings, for offsets) -> the task's results."""

    def initialize(self, args: dict[str, Any]) -> None:
        settings, artifact = self._open(args)
        self.encoder = artifact.encoder()
        self.output_names = settings["model_outputs"]

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            outputs = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.output_names}
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            if self.wire.triton_windows:  # drop the empty windows; the rest are in the order prepare makes them
                real = mask.reshape(-1, mask.shape[-1]).any(axis=1)
                mask = mask.reshape(-1, mask.shape[-1])[real]
                outputs = {n: a.reshape(-1, *a.shape[2:])[real] for n, a in outputs.items()}
            options = self.handler.options()
            prepared = self.handler.features(_items(self.wire, request), self.encoder, options)
            reduced = self.handler.reduce(outputs, mask)
            results = self.handler.finalize(prepared, reduced, options, self.encoder)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, array) for name, array in self.wire.triton_arrays(results).items()]))
        return responses
