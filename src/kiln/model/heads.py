"""Graph heads: what a task computes inside its exported graph from the transformers model's outputs.

Most tasks export the model's own outputs. A head pools or reshapes inside the graph, so every engine (PyTorch,
TorchScript, ONNX, OpenVINO) returns the task's output itself: SPLADE's vocabulary-sized vector per text instead
of a logit per token and vocabulary entry. A task names its head (``TaskSpec.graph_head``); a saved PyTorch variant
records the name beside its weights (``kiln_io.json``), so loading it needs no task code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kiln.errors import ArtifactError

Head = Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[Any, ...]]
OUTPUTS = "outputs"  # the model's outputs named by the task, as the model gives them (no head)


def sparse_max_pool(outputs: Mapping[str, Any], inputs: Mapping[str, Any]) -> tuple[Any, ...]:
    """SPLADE's pooling: log(1 + relu(logits)) over the attended positions, the maximum per vocabulary entry."""
    import torch  # a head runs inside a torch graph only

    logits = outputs["logits"]
    mask = inputs["attention_mask"].unsqueeze(-1).to(logits.dtype)
    return (torch.log1p(torch.relu(logits * mask)).amax(dim=1),)


HEADS: dict[str, Head | None] = {
    OUTPUTS: None,
    "sparse-max-pool": sparse_max_pool,
}


def graph_head(name: str) -> Head | None:
    """The head registered as ``name`` (None: the model's own outputs), or an ArtifactError listing the heads."""
    if name not in HEADS:
        raise ArtifactError(f"unknown graph head {name!r} (kiln knows: {', '.join(HEADS)}); a newer kiln wrote it")
    return HEADS[name]
