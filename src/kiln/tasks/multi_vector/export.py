"""multi-vector's export part: the encoder followed by its ColBERT projections (PyLate's or colbert-ai's
layout), and the settings of late interaction read from the checkpoint."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from kiln.errors import ModelLoadError, UnsupportedModelError
from kiln.tasks.export import TaskExport, batch_pad_id
from kiln.tasks.files import load_dense, read_json
from kiln.tasks.rerank.export import RerankExport

DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32, "document_length": 180,
            "do_query_expansion": True, "attend_to_expansion_tokens": False}  # PyLate's, where the config is silent


class SentenceTransformersLayout:
    """PyLate's (and sentence-transformers'): modules.json lists the Dense projections after the encoder, each in
    its own directory; config_sentence_transformers.json holds the markers, lengths and skiplist."""

    marker = "modules.json"

    @staticmethod
    def given(model_dir: Path) -> dict[str, Any]:
        path = model_dir / "config_sentence_transformers.json"
        return read_json(path) if path.is_file() else {}

    @staticmethod
    def projections(model_dir: Path) -> list[Any]:
        modules = sorted(json.loads((model_dir / "modules.json").read_text()), key=lambda m: m["idx"])
        return [load_dense(model_dir / m["path"]) for m in modules if m["type"].rsplit(".", 1)[-1] == "Dense"]


class ColbertAiLayout:
    """The original ColBERT's (``colbert-ai``, e.g. colbert-ir/colbertv2.0): one weights file with the encoder under
    ``bert.`` (transformers loads it as the base model) and the bias-free projection as ``linear.weight``, and
    ``artifact.metadata`` (its ColBERTConfig) with the markers (``[unused0]``/``[unused1]``), lengths and whether
    punctuation is masked. Its encoding is PyLate's (both insert the marker after [CLS] and expand queries with
    [MASK] to the query length), so only the names are read differently."""

    marker = "artifact.metadata"

    @staticmethod
    def given(model_dir: Path) -> dict[str, Any]:
        meta = read_json(model_dir / "artifact.metadata")
        return {"query_prefix": meta.get("query_token_id", "[unused0]"),
                "document_prefix": meta.get("doc_token_id", "[unused1]"),
                "query_length": meta.get("query_maxlen", 32), "document_length": meta.get("doc_maxlen", 220),
                "attend_to_expansion_tokens": meta.get("attend_to_mask_tokens", False), "do_query_expansion": True,
                "skiplist_words": list(string.punctuation) if meta.get("mask_punctuation", True) else []}

    @staticmethod
    def projections(model_dir: Path) -> list[Any]:
        import torch

        state = _weights(model_dir)
        if "linear.weight" not in state:
            raise UnsupportedModelError(f"{model_dir}: a colbert-ai checkpoint keeps its projection as linear.weight; "
                                        "its weights have none")
        weight = state["linear.weight"]
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        linear.load_state_dict({"weight": weight})
        return [linear.eval()]


LAYOUTS = (SentenceTransformersLayout, ColbertAiLayout)  # the first whose marker file the checkpoint has


def _layout(model_dir: Path) -> type[SentenceTransformersLayout] | type[ColbertAiLayout]:
    found = next((layout for layout in LAYOUTS if (model_dir / layout.marker).is_file()), None)
    if found is None:
        raise UnsupportedModelError(f"{model_dir} has neither modules.json (PyLate / sentence-transformers layout) nor "
                                    "artifact.metadata (colbert-ai layout): kiln cannot find its projection")
    return found


def _weights(model_dir: Path) -> dict[str, Any]:
    """A checkpoint's tensors: model.safetensors, else pytorch_model.bin read with torch's weights-only loader (kiln
    reached here only if --allow-pickle let the pickled file through: kiln.source.loading.check_weights)."""
    if (model_dir / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(model_dir / "model.safetensors"))
    if (model_dir / "pytorch_model.bin").is_file():
        import torch

        return torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ModelLoadError(f"{model_dir} holds neither model.safetensors nor pytorch_model.bin")


class MultiVectorExport(TaskExport):
    auto_class = "AutoModel"
    output_names = ("token_embeddings",)
    sequence_outputs = frozenset({"token_embeddings"})
    needs_trained_head = False  # the encoder's own outputs; the projection is loaded beside it (attach_head)

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        layout = _layout(model_dir)
        given = layout.given(model_dir)
        found = {key: given.get(key, default) if given.get(key) is not None else default
                 for key, default in DEFAULTS.items()}
        ids = {}
        for key in ("query_prefix", "document_prefix"):
            token_id = tokenizer.convert_tokens_to_ids(found[key])
            if token_id is None or token_id == tokenizer.unk_token_id:
                raise UnsupportedModelError(f"{model_dir}: the {key.replace('_', ' ')} {found[key]!r} is not a token "
                                            "of its tokenizer (PyLate adds it as one; so does kiln's reading)")
            ids[key + "_id"] = int(token_id)
        if tokenizer.mask_token_id is None:
            raise UnsupportedModelError(f"{model_dir}: query expansion needs a [MASK] token; the tokenizer has none")
        words = given.get("skiplist_words")
        words = list(string.punctuation) if words is None else words
        skip = sorted({int(i) for i in tokenizer.convert_tokens_to_ids(list(words)) if i is not None})
        projections = layout.projections(model_dir)
        # Never past what the encoder reads (its positions; the tokenizer's limit, which RoBERTa-style offsets
        # lower): a checkpoint may name a document length its encoder cannot take, which would fail in its
        # embeddings. PyLate's and sentence-transformers' max_seq_length is not the bound: PyLate cuts at the lengths.
        limit = int(hf_config.max_position_embeddings)
        if 0 < int(getattr(tokenizer, "model_max_length", 0) or 0) < 100_000:
            limit = min(limit, int(tokenizer.model_max_length))
        return {"dimension": projections[-1].out_features if projections else hf_config.hidden_size,
                "late_interaction": {
            "query_length": min(int(found["query_length"]), limit),
            "document_length": min(int(found["document_length"]), limit),
            "expansion_id": int(tokenizer.mask_token_id), "do_query_expansion": bool(found["do_query_expansion"]),
            "attend_to_expansion_tokens": bool(found["attend_to_expansion_tokens"]), "skiplist_ids": skip, **ids}}

    @classmethod
    def pad_id(cls, tokenizer: Any, config: Any) -> int:
        """Not the [MASK] query expansion: PyLate saves its tokenizer with [MASK] as the padding token (it expands
        queries by padding them), so a padded batch would read as expanded queries, and a text's vectors would
        depend on its batch. kiln expands queries itself, so it pads with the tokenizer's own padding token
        (tokenizer.json's padding settings, else its [PAD] / <pad> token)."""
        found = batch_pad_id(tokenizer, config)
        if found != tokenizer.mask_token_id:
            return found
        padding = getattr(getattr(tokenizer, "backend_tokenizer", None), "padding", None) or {}
        vocab = tokenizer.get_vocab()
        candidates = [padding.get("pad_id"), *(vocab.get(name) for name in ("[PAD]", "<pad>"))]
        chosen = next((int(i) for i in candidates if i is not None and i != tokenizer.mask_token_id), None)
        if chosen is None:
            raise UnsupportedModelError("the tokenizer pads with its [MASK] token, which is also the query "
                                        "expansion token, and has no other padding token ([PAD] or <pad>) kiln "
                                        "could pad batches with")
        return chosen

    @classmethod
    def attach_head(cls, hf_model: Any, model_dir: Path, tokenizer: Any) -> Any:
        """The encoder followed by its Dense projections: the module every variant is exported from."""
        from kiln.model.projected import ProjectedModel

        return ProjectedModel(hf_model, _layout(model_dir).projections(model_dir), "token_embeddings")

    # a reranker's inputs (queries over texts), so parity exercises both encodings
    parity_inputs = RerankExport.parity_inputs
