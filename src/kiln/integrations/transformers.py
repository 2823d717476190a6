"""A kiln artifact inside transformers: ``hf_model`` / ``hf_tokenizer`` for ``transformers.pipeline``, and
``kiln.pipeline`` for every task (QA included, which transformers 5 no longer ships).

``hf_model`` is a ``PreTrainedModel`` of its own ``model_type: kiln``, registered with transformers' Auto classes
(the documented extension point), so pipelines accept it as a supported model. Its ``forward`` hands the
pipeline's tensors to the artifact's engine (ONNX Runtime, OpenVINO, …) and returns the usual ModelOutput; the
pipeline's own pre- and post-processing run unchanged around it. torch and transformers are imported only here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import (
    BaseModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from kiln.artifact.directory import Artifact, load
from kiln.errors import UsageError
from kiln.runtime.predictor import Predictor
from kiln.tasks import task_spec
from kiln.tasks.wire import task_wire

MODEL_TYPE = "kiln"


class KilnConfig(PretrainedConfig):
    """Labels and problem type of the artifact's task, as transformers' pipelines read them."""

    model_type = MODEL_TYPE


class _KilnModel(PreTrainedModel):
    config_class = KilnConfig
    base_model_prefix = "kiln"
    main_input_name = "input_ids"
    output_class: type = BaseModelOutput

    def __init__(self, config: KilnConfig, predictor: Predictor | None = None) -> None:
        super().__init__(config)
        self.predictor = predictor
        # One parameter so .device and .dtype answer (CPU, float32): the weights live in the engine.
        self._anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:  # nothing to initialise: the engine holds the weights
        return

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **_: Any) -> Any:
        if self.predictor is None:
            raise UsageError("this kiln model has no engine; build it with kiln.hf_model(ARTIFACT)")
        ids = input_ids.detach().cpu().numpy().astype(np.int64)
        arrays = {"input_ids": ids,
                  "attention_mask": np.ones_like(ids) if attention_mask is None
                  else attention_mask.detach().cpu().numpy().astype(np.int64),
                  "token_type_ids": np.zeros_like(ids) if token_type_ids is None
                  else token_type_ids.detach().cpu().numpy().astype(np.int64)}
        outputs = self.predictor.engine.run(arrays)
        return self.output_class(**{name: torch.from_numpy(np.ascontiguousarray(outputs[name]))
                                    for name in self.predictor.engine.output_names})


class KilnModel(_KilnModel):
    output_class = BaseModelOutput


class KilnForSequenceClassification(_KilnModel):
    output_class = SequenceClassifierOutput


class KilnForTokenClassification(_KilnModel):
    output_class = TokenClassifierOutput


class KilnForQuestionAnswering(_KilnModel):
    output_class = QuestionAnsweringModelOutput


# The task spec names its transformers Auto class; each gets the kiln class that answers like it.
MODEL_CLASSES: dict[str, type[_KilnModel]] = {
    "AutoModel": KilnModel,
    "AutoModelForSequenceClassification": KilnForSequenceClassification,
    "AutoModelForTokenClassification": KilnForTokenClassification,
    "AutoModelForQuestionAnswering": KilnForQuestionAnswering,
}


_registered = False


def _register() -> None:
    """Register the kiln classes with transformers' Auto classes (once per process)."""
    global _registered
    if _registered:
        return
    transformers.AutoConfig.register(MODEL_TYPE, KilnConfig, exist_ok=True)
    for auto_name, cls in MODEL_CLASSES.items():
        getattr(transformers, auto_name).register(KilnConfig, cls, exist_ok=True)
    _registered = True


def hf_model(path: str | Path, variant: str | None = None, *, threads: int | None = None) -> _KilnModel:
    """The artifact's variant as a transformers model (``transformers.pipeline(task, model=..., tokenizer=...)``)."""
    _register()
    predictor = load(path, variant, threads=threads)
    spec = task_spec(predictor.config.task)
    if spec.export.auto_class not in MODEL_CLASSES:
        raise UsageError(f"{spec.name} artifacts have no transformers model class; use kiln.pipeline(task, path), "
                         "predict() or generate()")
    if predictor.config.pair_prompt is not None:  # a transformers pipeline would tokenize bare pairs: wrong scores
        raise UsageError(f"{path} is a causal reranker: it reads each pair through its prompt template, which "
                         "transformers' pipelines do not apply; use kiln.load(path).rerank(query, texts)")
    id2label = {int(k): v for k, v in predictor.config.id2label.items()}
    config = KilnConfig(id2label=id2label or None, label2id={v: k for k, v in id2label.items()} or None,
                        problem_type=predictor.config.problem_type,
                        max_position_embeddings=predictor.config.max_length)
    return MODEL_CLASSES[spec.export.auto_class](config, predictor).eval()


def hf_tokenizer(path: str | Path) -> Any:
    """The artifact's tokenizer as a transformers fast tokenizer, its maximum length set to the model's."""
    artifact = Artifact.open(path)
    directory = artifact.path / Path(artifact.manifest.tokenizer.path).parent
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer.model_max_length = artifact.task_config.max_length
    return tokenizer


def pipeline(task: str, path: str | Path, variant: str | None = None, *, threads: int | None = None,
             **kwargs: Any) -> Any:
    """kiln's own pipeline where the task has one (a task transformers 5 dropped, or text generation, whose loop is
    kiln's), else ``transformers.pipeline(task, ...)`` on the artifact."""
    artifact_task = Artifact.open(path).task_config.task
    spec = task_spec(task)
    if spec.name != artifact_task:
        raise UsageError(f"{path} is a {artifact_task} artifact; asked for a {task} pipeline")
    pipeline = task_wire(spec.name).pipeline
    if pipeline is not None:
        return pipeline(load(path, variant, threads=threads), **kwargs)
    if task in transformers.pipelines.SUPPORTED_TASKS:
        return transformers.pipeline(task, model=hf_model(path, variant, threads=threads),
                                     tokenizer=hf_tokenizer(path), **kwargs)
    raise UsageError(f"transformers has no {task} pipeline and kiln offers none; use predict()")


__all__ = ["KilnConfig", "hf_model", "hf_tokenizer", "pipeline"]
