"""hybrid-embedding's export part: BGE-M3's layout (FlagEmbedding's ``BGEM3FlagModel``): an encoder with its
sentence-transformers files (CLS pooling, Normalize) and two heads beside it, ``sparse_linear.pt`` (hidden -> 1) and
``colbert_linear.pt`` (hidden -> ColBERT size), run as one graph with three outputs (kiln.model.hybrid)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.choices import Pooling
from kiln.errors import ModelLoadError, UnsupportedModelError
from kiln.tasks.feature_extraction.export import FeatureExtractionExport, dense_dirs

HEADS = {"sparse": "sparse_linear.pt", "colbert": "colbert_linear.pt"}  # FlagEmbedding's file names
# The graph's outputs: the CLS state, a weight per token, a ColBERT vector per token (kiln.model.hybrid).
DENSE, TOKEN_WEIGHTS, TOKEN_VECTORS = "sentence_embedding", "token_weights", "token_embeddings"


def _head(model_dir: Path, name: str, hidden: int) -> Any:
    """One of the heads as a torch Linear. FlagEmbedding saves them with ``torch.save(state_dict)``; they are read
    with torch's weights-only loader, which rebuilds tensors and refuses any other object, so no pickled code runs
    (why kiln's --allow-pickle, which guards whole pickled models, is not asked for here)."""
    import torch

    path = model_dir / HEADS[name]
    if not path.is_file():
        missing = ", ".join(f for f in HEADS.values() if not (model_dir / f).is_file())
        raise UnsupportedModelError(f"{model_dir} is not in BGE-M3's layout: {missing} missing (hybrid-embedding "
                                    "reads the encoder with sparse_linear.pt and colbert_linear.pt beside it, as "
                                    "FlagEmbedding saves them); for its dense vectors alone use feature-extraction")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or non-tensor file: say which one and why
        raise ModelLoadError(f"could not read {path} as a state dict of tensors: {err}") from err
    weight = state.get("weight") if isinstance(state, dict) else None
    if weight is None or weight.dim() != 2 or weight.shape[1] != hidden:
        raise ModelLoadError(f"{path} must hold a Linear's weight [out, {hidden}] (and bias); got "
                             f"{ {k: tuple(v.shape) for k, v in state.items()} if isinstance(state, dict) else state}")
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in state)
    linear.load_state_dict(state)
    return linear.eval()


class HybridEmbeddingExport(FeatureExtractionExport):
    output_names = (DENSE, TOKEN_WEIGHTS, TOKEN_VECTORS)
    sequence_outputs = frozenset({TOKEN_WEIGHTS, TOKEN_VECTORS})

    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any, tokenizer: Any) -> dict[str, Any]:
        """Feature extraction's settings for the dense vector (CLS pooling and normalization where the model has no
        sentence-transformers files: FlagEmbedding's defaults for M3), the ids whose lexical weight is never kept
        (FlagEmbedding's: CLS, EOS, PAD, UNK) and the ColBERT vectors' size."""
        hidden = int(hf_config.hidden_size)
        colbert = _head(model_dir, "colbert", hidden)
        if _head(model_dir, "sparse", hidden).out_features != 1:
            raise ModelLoadError(f"{model_dir / HEADS['sparse']} must map each token state to one weight")
        found = super().settings(model_dir, hf_config, tokenizer)
        if not (model_dir / "modules.json").is_file():
            found |= {"pooling": Pooling.CLS, "normalize": True}
        if found["pooling"] is not Pooling.CLS or dense_dirs(model_dir):
            raise UnsupportedModelError(
                f"{model_dir} pools with {found['pooling'].value}"
                f"{' and projects the pooled vector (Dense)' if dense_dirs(model_dir) else ''}; BGE-M3's dense "
                "vector is its CLS state, which kiln's hybrid graph returns")
        unused = {getattr(tokenizer, f"{name}_token_id") for name in ("cls", "eos", "pad", "unk")} - {None}
        return {**found, "special_ids": tuple(sorted(int(i) for i in unused)),
                "late_interaction": {"dimension": int(colbert.out_features)}}

    @classmethod
    def attach_head(cls, hf_model: Any, model_dir: Path, tokenizer: Any) -> Any:
        from kiln.model.hybrid import HybridModel

        hidden = int(hf_model.config.hidden_size)
        return HybridModel(hf_model, _head(model_dir, "sparse", hidden), _head(model_dir, "colbert", hidden),
                           cls.output_names)
