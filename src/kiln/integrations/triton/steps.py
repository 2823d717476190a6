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

        version_dir = Path(args["model_repository"]) / args["model_version"]
        settings = json.loads((version_dir / STEP_FILE).read_text())
        return settings, Artifact.open(version_dir / settings["artifact"], check=False)

    def finalize(self) -> None:
        return


def _texts(request: Any) -> list[str]:
    import triton_python_backend_utils as pb_utils

    raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in raw]


def bucket(length: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``length`` tokens (the largest bucket is the model's maximum)."""
    return next((b for b in buckets if b >= length), buckets[-1])


class TokenizeStep(_Step):
    """TEXT -> input ids, attention mask (and token types), padded to a length bucket."""

    def initialize(self, args: dict[str, Any]) -> None:
        settings, artifact = self._open(args)
        self.encoder = artifact.encoder()
        self.buckets = sorted(settings["buckets"])

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            encodings = self.encoder.encode(_texts(request))
            width = bucket(max(len(e.ids) for e in encodings), self.buckets)
            arrays = self.encoder.collate(encodings, multiple=width)  # every row padded to exactly the bucket
            arrays = {name: a[:, :width] for name, a in arrays.items()}
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.ascontiguousarray(a, dtype=np.int64)) for name, a in arrays.items()]))
        return responses


class ModelStep(_Step):
    """The artifact's engine (ONNX Runtime or OpenVINO on the CPU): Triton's batch of requests in one run."""

    def initialize(self, args: dict[str, Any]) -> None:
        settings, artifact = self._open(args)
        self.engine = artifact.engine(options=artifact.serving_options(threads=settings.get("threads")))
        self.engine.warmup()
        from kiln.tasks import task_spec

        self.per_token = task_spec(artifact.task_config.task).sequence_outputs

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        feeds = [{name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.engine.input_names}
                 for r in requests]
        rows = [f["input_ids"].shape[0] for f in feeds]
        width = max(f["input_ids"].shape[1] for f in feeds)
        batch = {name: np.concatenate([np.pad(f[name], ((0, 0), (0, width - f[name].shape[1]))) for f in feeds])
                 for name in self.engine.input_names}
        outputs = self.engine.run(batch)
        responses, start = [], 0
        for feed, count in zip(feeds, rows):
            length = feed["input_ids"].shape[1]
            tensors = []
            for name in self.engine.output_names:
                part = outputs[name][start : start + count]
                if name in self.per_token:  # back to this request's own (bucket) length
                    part = part[:, :length]
                tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(part, dtype=np.float32)))
            responses.append(pb_utils.InferenceResponse(tensors))
            start += count
        return responses


class PostStep(_Step):
    """Model outputs + attention mask (+ TEXT, for offsets) -> the task's results as the ensemble's outputs."""

    def initialize(self, args: dict[str, Any]) -> None:
        settings, artifact = self._open(args)
        self.encoder = artifact.encoder()
        from kiln.tasks import task_handler

        self.handler = task_handler(artifact.task_config)
        self.output_names = settings["model_outputs"]

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            texts = _texts(request)
            outputs = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.output_names}
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            options = self.handler.options()
            prepared = self.handler.prepare(self.handler.check_inputs(texts), self.encoder, options)
            reduced = self.handler.reduce(outputs, mask)
            results = self.handler.finalize(prepared, reduced, options, self.encoder)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, array) for name, array in self.handler.triton_arrays(results).items()]))
        return responses
