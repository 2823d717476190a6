"""Check a Triton model repository the way Triton would load it, before anyone starts a server.

Every ``config.pbtxt`` must parse as Triton's ``ModelConfig``; each ensemble step's inputs must be fed by an
ensemble input or an earlier step's output of the same data type, and name tensors its model declares; an
ONNX Runtime-backend model's tensors must match the ONNX graph (names, element types, ranks without the batch
axis); ``max_batch_size: 0`` with dynamic batching is refused (Triton then never batches).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.errors import ArtifactError

# ONNX element types (TensorProto) -> Triton data types.
_ONNX_TO_TRITON = {1: "TYPE_FP32", 7: "TYPE_INT64", 6: "TYPE_INT32", 10: "TYPE_FP16", 8: "TYPE_STRING"}


def read_configs(repository: Path) -> dict[str, Any]:
    """Every model's config, parsed with Triton's protobuf schema: {model name: ModelConfig}."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    configs = {}
    for path in sorted(repository.glob("*/config.pbtxt")):
        message = pb.ModelConfig()
        try:
            text_format.Parse(path.read_text(), message)
        except text_format.ParseError as err:
            raise ArtifactError(f"{path} is not a valid Triton ModelConfig: {err}") from err
        configs[message.name or path.parent.name] = message
    if not configs:
        raise ArtifactError(f"{repository} has no */config.pbtxt: not a Triton model repository")
    return configs


def check_repository(repository: Path) -> dict[str, Any]:
    """Parse and check every config; raise one ArtifactError listing every problem found."""
    from tritonclient.grpc import model_config_pb2 as pb

    configs = read_configs(repository)
    problems: list[str] = []
    for name, config in configs.items():
        if config.max_batch_size == 0 and config.HasField("dynamic_batching"):
            problems.append(f"{name}: max_batch_size 0 turns dynamic batching off; set max_batch_size > 0")
        if config.platform == "ensemble":
            problems += _ensemble_problems(name, config, configs, pb)
        elif config.backend == "onnxruntime":
            problems += _onnx_problems(repository, name, config, pb)
    if problems:
        raise ArtifactError(f"Triton repository {repository} has problems: " + "; ".join(problems))
    return configs


def _ensemble_problems(name: str, ensemble: Any, configs: dict[str, Any], pb: Any) -> list[str]:
    problems = []
    available = {i.name: i.data_type for i in ensemble.input}  # tensors known so far -> data type
    for k, step in enumerate(ensemble.ensemble_scheduling.step):
        model = configs.get(step.model_name)
        if model is None:
            problems.append(f"{name} step {k}: model {step.model_name!r} is not in the repository")
            continue
        inputs = {i.name: i.data_type for i in model.input}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                problems.append(f"{name} step {k}: {step.model_name} has no input {model_input!r}")
            elif tensor not in available:
                problems.append(f"{name} step {k}: {step.model_name}.{model_input} is fed {tensor!r}, which no "
                                "ensemble input or earlier step produces")
            elif available[tensor] != inputs[model_input]:
                problems.append(f"{name} step {k}: {tensor!r} is {pb.DataType.Name(available[tensor])} but "
                                f"{step.model_name}.{model_input} takes {pb.DataType.Name(inputs[model_input])}")
        missing = sorted(set(inputs) - set(step.input_map))
        if missing:
            problems.append(f"{name} step {k}: {step.model_name} inputs {missing} are not fed")
        outputs = {o.name: o.data_type for o in model.output}
        for model_output, tensor in step.output_map.items():
            if model_output not in outputs:
                problems.append(f"{name} step {k}: {step.model_name} has no output {model_output!r}")
            else:
                available[tensor] = outputs[model_output]
    for output in ensemble.output:
        if output.name not in available:
            problems.append(f"{name}: ensemble output {output.name!r} is produced by no step")
    return problems


def _onnx_problems(repository: Path, name: str, config: Any, pb: Any) -> list[str]:
    import onnx

    path = repository / name / "1" / "model.onnx"
    if not path.is_file():
        return [f"{name}: {path} is missing"]
    graph = onnx.load(str(path), load_external_data=False).graph
    problems = []
    batched = config.max_batch_size > 0
    for declared, actual in ((config.input, graph.input), (config.output, graph.output)):
        by_name = {t.name: t for t in actual}
        for tensor in declared:
            real = by_name.get(tensor.name)
            if real is None:
                problems.append(f"{name}: {tensor.name!r} is not a tensor of the ONNX graph")
                continue
            element = _ONNX_TO_TRITON.get(real.type.tensor_type.elem_type, "?")
            if element != pb.DataType.Name(tensor.data_type):
                problems.append(f"{name}: {tensor.name} is {element} in the graph, "
                                f"{pb.DataType.Name(tensor.data_type)} in config.pbtxt")
            rank = len(real.type.tensor_type.shape.dim) - (1 if batched else 0)
            if rank != len(tensor.dims):
                problems.append(f"{name}: {tensor.name} has {rank} dims (batch excluded) in the graph, "
                                f"{len(tensor.dims)} in config.pbtxt")
    return problems
