"""feature-extraction's export part: the encoder's hidden states, pooling and normalization read from its
sentence-transformers config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.choices import Pooling, Similarity, names
from kiln.errors import UnsupportedModelError
from kiln.tasks.export import TaskExport
from kiln.tasks.files import load_dense, read_json

# sentence-transformers modules kiln reproduces: Dense projections inside the graph, the rest in its post-processing.
ST_MODULES = {"Transformer", "Pooling", "Dense", "Normalize"}


def _modules(model_dir: Path) -> list[dict[str, Any]]:
    found = model_dir / "modules.json"
    return sorted(read_json(found), key=lambda m: m.get("idx", 0)) if found.is_file() else []


def dense_dirs(model_dir: Path) -> list[Path]:
    return [model_dir / m["path"] for m in _modules(model_dir) if str(m.get("type", "")).endswith(".Dense")]


def _pooling_mode(pool_config: dict[str, Any], model_dir: Path) -> Pooling:
    if isinstance(mode := pool_config.get("pooling_mode"), str):
        names = {mode}
    else:
        names = {k.removeprefix("pooling_mode_") for k, v in pool_config.items()
                 if k.startswith("pooling_mode_") and v}
    by_flag = {"mean_tokens": Pooling.MEAN, "mean": Pooling.MEAN, "cls_token": Pooling.CLS, "cls": Pooling.CLS,
               "max_tokens": Pooling.MAX, "max": Pooling.MAX, "lasttoken": Pooling.LASTTOKEN}
    if len(names) != 1 or (name := names.pop()) not in by_flag:
        raise UnsupportedModelError(
            f"{model_dir} pools with {sorted(names) or 'nothing'}; kiln supports exactly one of mean, cls, max, "
            "lasttoken"
        )
    return by_flag[name]


class FeatureExtractionExport(TaskExport):
    auto_class = "AutoModel"
    output_names = ("last_hidden_state",)
    sequence_outputs = frozenset(output_names)
    needs_trained_head = False

    @staticmethod
    def _pooling_settings(model_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """Pooling and normalization from modules.json / 1_Pooling/config.json (mean without them), and that
        Pooling config itself (empty without one)."""
        if not (model_dir / "modules.json").is_file():
            return {"pooling": Pooling.MEAN, "normalize": False}, {}
        kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in _modules(model_dir)}
        unknown = sorted(set(kinds) - ST_MODULES)
        if unknown:
            raise UnsupportedModelError(
                f"{model_dir} uses sentence-transformers modules kiln does not reproduce: {', '.join(unknown)} "
                f"(supported: {', '.join(sorted(ST_MODULES))})"
            )
        pooling, pool_config = Pooling.MEAN, {}
        if "Pooling" in kinds:
            pool_config = read_json(model_dir / kinds["Pooling"].get("path", "1_Pooling") / "config.json")
            pooling = _pooling_mode(pool_config, model_dir)
        return {"pooling": pooling, "normalize": "Normalize" in kinds}, pool_config

    @staticmethod
    def _prompt_settings(model_dir: Path, pooling_config: dict[str, Any]) -> dict[str, Any]:
        """The named prompts, the default one and the similarity function from config_sentence_transformers.json
        (none without it)."""
        found = model_dir / "config_sentence_transformers.json"
        raw = read_json(found) if found.is_file() else {}
        prompts = {str(k): str(v) for k, v in (raw.get("prompts") or {}).items()}
        default = raw.get("default_prompt_name")
        if default is not None and default not in prompts:
            raise UnsupportedModelError(f"{found}: default_prompt_name {default!r} is not one of its prompts "
                                        f"({', '.join(sorted(prompts)) or 'none'})")
        if prompts and pooling_config.get("include_prompt") is False:
            raise UnsupportedModelError(
                f"{model_dir} pools without its prompt's tokens (include_prompt false in its Pooling config); kiln "
                "pools every token of the prompted text, so its vectors would differ from sentence-transformers'")
        similarity = raw.get("similarity_fn_name")
        if similarity is not None and similarity not in {s.value for s in Similarity}:
            raise UnsupportedModelError(f"{found}: similarity_fn_name {similarity!r} is not one of "
                                        f"{names(Similarity)}")
        return {"prompts": prompts, "default_prompt_name": default, "similarity_fn_name": similarity}

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        pooling, pool_config = cls._pooling_settings(model_dir)
        dense = dense_dirs(model_dir)
        if dense and pooling["pooling"] is Pooling.MAX:
            raise UnsupportedModelError(
                f"{model_dir} max-pools before its Dense projections; kiln projects every token state inside the "
                "graph, which equals projecting the pooled vector for mean, CLS and last-token pooling only")
        size = int(read_json(dense[-1] / "config.json")["out_features"]) if dense else int(hf_config.hidden_size)
        return {**pooling, **cls._prompt_settings(model_dir, pool_config), "dimension": size, "projected": bool(dense)}

    @classmethod
    def attach_head(cls, hf_model: Any, model_dir: Path, tokenizer: Any) -> Any:
        """The encoder, followed by its Dense projections where it has some (EmbeddingGemma): applied to each
        token state inside the graph (kiln.model.projected says why that equals projecting the pooled vector)."""
        dense = dense_dirs(model_dir)
        if not dense:
            return hf_model
        from kiln.model.projected import ProjectedModel

        return ProjectedModel(hf_model, [load_dense(d) for d in dense], "last_hidden_state")
