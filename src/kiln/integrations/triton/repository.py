"""`kiln triton ARTIFACT -o REPO`: a Triton model repository for one kiln artifact.

``NAME`` (ensemble: TEXT -> the task's outputs) = ``NAME_tokenizer`` (Python backend) -> ``NAME_model`` ->
``NAME_post`` (Python backend). The model step is Triton's ONNX Runtime backend (``--device cuda``: KIND_GPU;
``--device tensorrt``: KIND_GPU with TensorRT fp16; ``--device cpu``: KIND_CPU with the thread count from
``kiln bench``'s serving.json), or a Python-backend step running kiln's engine (``--python-model``, and always for
an OpenVINO variant). Every config is a ``ModelConfig`` message of Triton's own protobuf schema, written with
``text_format`` and checked (``check.py``) before the repository is moved into place.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.artifact.directory import Artifact
from kiln.artifact.staging import staged_directory
from kiln.choices import Device, parse_choice
from kiln.engines.base import warmup_inputs
from kiln.errors import MissingDependencyError, UsageError
from kiln.integrations.triton.steps import STEP_FILE
from kiln.records.artifact import ServingDefault, VariantRecord
from kiln.tasks import task_spec
from kiln.tasks.wire import TaskWire, task_wire

STEP_MODULE = "kiln.integrations.triton.steps"


@dataclass(frozen=True)
class TritonConfig:
    artifact: Path
    output: Path
    device: Device = Device.CPU
    python_model: bool = False  # the model step as a Python-backend step running kiln's engine
    buckets: tuple[int, ...] | None = None  # padded lengths; default: quantiles of the task's timing mix
    max_batch_size: int = 32
    max_queue_delay_us: int = 2000
    instances: int | None = None  # model-step instances; default: sessions from serving.json, else 1
    name: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", parse_choice(Device, self.device, "device"))
        if self.max_batch_size < 1:
            raise UsageError(f"max_batch_size must be at least 1 (got {self.max_batch_size}); 0 would turn "
                             "Triton's dynamic batching off")
        if self.buckets is not None and (not self.buckets or min(self.buckets) < 2):
            raise UsageError(f"buckets must be token lengths of at least 2 (got {self.buckets})")


def _pb():
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError as err:
        raise MissingDependencyError(f"tritonclient is not installed ({err}); install it with: pip install "
                                     "'kiln[triton]'") from err
    return model_config_pb2, text_format


def default_buckets(artifact: Artifact) -> tuple[int, ...]:
    """Padded lengths from the token lengths of the task's timing mix: its quartiles and 90th percentile, rounded
    up to 16, and the model's maximum (so every request fits one bucket)."""
    from kiln.tasks import task_handler

    encoder = artifact.encoder()
    handler = task_handler(artifact.task_config)
    inputs = task_spec(artifact.task_config.task).validation.timing_inputs(encoder, 128)
    lengths = [len(e.ids) for e in handler.features(inputs, encoder).encodings]
    picks = {int(-(-np.percentile(lengths, q) // 16) * 16) for q in (25, 50, 75, 90)}
    return tuple(sorted({min(p, encoder.max_length) for p in picks} | {encoder.max_length}))


def _tensor(pb, name: str, dtype: str, dims: tuple[int, ...]):
    return pb.ModelInput(name=name, data_type=pb.DataType.Value(dtype), dims=list(dims))


def _output(pb, name: str, dtype: str, dims: tuple[int, ...]):
    return pb.ModelOutput(name=name, data_type=pb.DataType.Value(dtype), dims=list(dims))


def _python_step(pb, name: str, inputs, outputs, max_batch_size: int, count: int = 1, batching: bool = True):
    config = pb.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size, input=inputs, output=outputs,
                            instance_group=[pb.ModelInstanceGroup(count=count, kind=pb.ModelInstanceGroup.KIND_CPU)])
    if batching:
        config.dynamic_batching.CopyFrom(pb.ModelDynamicBatching())
    return config


def write_repository(config: TritonConfig) -> Path:
    """Write the repository for ``config.artifact`` into ``config.output``; returns its path."""
    pb, text_format = _pb()
    artifact = Artifact.open(config.artifact)
    spec = task_spec(artifact.task_config.task)
    wire = task_wire(spec.name)
    refusal = wire.triton_refusal()
    if refusal:
        raise UsageError(refusal)
    variant = artifact.variant_name()
    record = artifact.variant(variant)
    # Triton's onnxruntime backend runs a whole batch in one call: a variant that must run each row alone to stay
    # batch-invariant (dynamic int8 with per-row scales) keeps that only in kiln's own engine, the Python step.
    python_model = config.python_model or record.engine != "onnxruntime" or record.options.rows_alone
    if not python_model and wire.triton_windows:
        raise UsageError(f"{spec.name} inputs become several windows each, an axis Triton's onnxruntime backend "
                         "cannot take: use --device cpu --python-model (the model step flattens the windows)")
    if config.device != Device.CPU and python_model and not config.python_model:
        why = ("runs each row of a batch alone to stay batch-invariant, which the backend's batched call would undo"
               if record.options.rows_alone else f"runs on {record.engine}")
        raise UsageError(f"device {config.device} needs an ONNX variant on Triton's onnxruntime backend; {variant} "
                         f"{why} (use --device cpu, or another ONNX variant with kiln optimize --variants)")
    if config.device != Device.CPU and python_model:
        raise UsageError(f"device {config.device} runs the model on Triton's onnxruntime backend; --python-model "
                         "runs kiln's engine on the CPU (drop one of them)")
    name = config.name or (artifact.path.resolve().parent.name if artifact.path.name == "best"
                           else artifact.path.resolve().name)
    serving = artifact.serving_default(variant)
    instances = config.instances or (serving.sessions if serving else 1)
    buckets = tuple(sorted(config.buckets)) if config.buckets else default_buckets(artifact)
    engine = artifact.engine(variant)
    input_names, output_names = engine.input_names, engine.output_names
    # Each output's rank without the batch axis, from one small run (sequence outputs may have 1 or 2 more axes).
    output_ranks = {n: a.ndim - 1 for n, a in engine.run(warmup_inputs(input_names)).items()}
    with staged_directory(config.output, overwrite=config.overwrite) as stage:
        configs = _configs(pb, config, wire, name, input_names, output_ranks, python_model, instances, serving)
        for model, message in configs.items():
            (stage / model / "1").mkdir(parents=True)
            header = f"# kiln triton: {model} for {artifact.path} ({variant})\n"
            if model.endswith("_tokenizer"):
                header += f"# buckets (padded lengths, from the token lengths of kiln's timing mix): {list(buckets)}\n"
            (stage / model / "config.pbtxt").write_text(header + text_format.MessageToString(message))
        _write_steps(stage, name, artifact, variant, buckets, output_names, python_model, record, serving)
        (stage / "README.md").write_text(_readme(name, config, spec.name, variant, buckets))
        from kiln.integrations.triton.check import check_repository

        check_repository(stage)
    return config.output.expanduser().resolve()


def _configs(pb, config: TritonConfig, wire: type[TaskWire], name: str, input_names, output_ranks: dict[str, int],
             python_model: bool, instances: int, serving: ServingDefault | None) -> dict[str, Any]:
    output_names = list(output_ranks)
    mbs = config.max_batch_size
    windows = (-1,) if wire.triton_windows else ()  # QA: a windows axis after the batch axis
    token = (*windows, -1)
    token_inputs = [_tensor(pb, n, "TYPE_INT64", token) for n in input_names]
    token_outputs = [_output(pb, n, "TYPE_INT64", token) for n in input_names]
    model_outputs = [_output(pb, n, "TYPE_FP32", (*windows, *(-1,) * rank)) for n, rank in output_ranks.items()]
    strings = [_tensor(pb, n, "TYPE_STRING", (1,)) for n in wire.triton_inputs]
    results = [_output(pb, n, dtype, dims) for n, dtype, dims in wire.triton_outputs]
    tokenizer = _python_step(pb, f"{name}_tokenizer", strings, token_outputs, mbs, batching=False)
    post = _python_step(pb, f"{name}_post", [*strings, _tensor(pb, "attention_mask", "TYPE_INT64", token),
                                             *[pb.ModelInput(name=o.name, data_type=o.data_type, dims=o.dims)
                                               for o in model_outputs]], results, mbs, batching=False)
    if python_model:
        model = _python_step(pb, f"{name}_model", token_inputs, model_outputs, mbs, count=instances)
    else:
        kind = pb.ModelInstanceGroup.KIND_CPU if config.device == Device.CPU else pb.ModelInstanceGroup.KIND_GPU
        model = pb.ModelConfig(name=f"{name}_model", backend="onnxruntime", platform="onnxruntime_onnx",
                               max_batch_size=mbs, input=token_inputs, output=model_outputs,
                               instance_group=[pb.ModelInstanceGroup(count=instances, kind=kind)])
        if config.device == Device.CPU and serving and serving.threads:
            model.parameters["intra_op_thread_count"].string_value = str(serving.threads)
        if config.device == Device.TENSORRT:
            accelerator = model.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
            accelerator.parameters["precision_mode"] = "FP16"
    model.dynamic_batching.CopyFrom(pb.ModelDynamicBatching(
        preferred_batch_size=sorted({min(8, mbs), mbs}), max_queue_delay_microseconds=config.max_queue_delay_us))
    ensemble = pb.ModelConfig(name=name, platform="ensemble", max_batch_size=mbs, input=strings, output=results)
    steps = ensemble.ensemble_scheduling.step
    steps.add(model_name=tokenizer.name, model_version=-1, input_map={n: n for n in wire.triton_inputs},
              output_map={n: n for n in input_names})
    steps.add(model_name=model.name, model_version=-1, input_map={n: n for n in input_names},
              output_map={n: n for n in output_names})
    steps.add(model_name=post.name, model_version=-1,
              input_map={**{n: n for n in wire.triton_inputs}, "attention_mask": "attention_mask",
                         **{n: n for n in output_names}},
              output_map={n: n for n, _, _ in wire.triton_outputs})
    return {name: ensemble, tokenizer.name: tokenizer, model.name: model, post.name: post}


def _write_steps(stage: Path, name: str, artifact: Artifact, variant: str, buckets: tuple[int, ...],
                 output_names, python_model: bool, record: VariantRecord, serving: ServingDefault | None) -> None:
    """The Python steps' model.py and settings, each with its own copy of the artifact's served variant."""
    from kiln.artifact.directory import extract_variant

    # (class, settings, whether the step runs the model): only the model step carries the variant's weights.
    steps = {f"{name}_tokenizer": ("TokenizeStep", {"buckets": list(buckets)}, False),
             f"{name}_post": ("PostStep", {"model_outputs": list(output_names)}, False)}
    if python_model:
        steps[f"{name}_model"] = ("ModelStep", {"threads": serving.threads if serving else None}, True)
    else:
        for rel in record.files:  # Triton's ONNX Runtime backend reads 1/model.onnx (+ its weights file)
            shutil.copy2(artifact.path / rel, stage / f"{name}_model" / "1" / Path(rel).name)
    for model, (cls, settings, runs_model) in steps.items():
        version = stage / model / "1"
        extract_variant(artifact, variant, version / "artifact", model=runs_model)
        (version / "model.py").write_text(f"from {STEP_MODULE} import {cls} as TritonPythonModel  # noqa: F401\n")
        (version / STEP_FILE).write_text(json.dumps({"artifact": "artifact", **settings}, indent=2) + "\n")


def _readme(name: str, config: TritonConfig, task: str, variant: str, buckets: tuple[int, ...]) -> str:
    return f"""# Triton model repository for {name} ({task}, variant {variant})

Written by `kiln triton`. The ensemble `{name}` takes `TEXT` (TYPE_STRING, one per request) and runs
`{name}_tokenizer` (Python backend, pads to the buckets {list(buckets)}) -> `{name}_model` -> `{name}_post`
(Python backend: the task's own post-processing).

Start it in NVIDIA's container, with kiln installed in the Python backend's environment:

    tritonserver --model-repository=$PWD

or, on a CPU machine, with PyPI's nvidia-pytriton binary (`kiln triton ... --device cpu --python-model`, see
kiln's `make triton-server`). Query it with tritonclient:

    import numpy as np, tritonclient.http as http
    client = http.InferenceServerClient("localhost:8000")
    text = http.InferInput("TEXT", [1, 1], "BYTES"); text.set_data_from_numpy(np.array([[b"hello"]], dtype=object))
    client.infer("{name}", [text]).as_numpy(...)
"""
