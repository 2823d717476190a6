"""`Predictor.encode`: sentence-transformers' `SentenceTransformer.encode`, on a kiln artifact.

Same arguments, meaning, shapes and dtypes, so swapping the import is the whole migration: a string gives a 1-D
float32 array, a list a 2-D one; ``truncate_dim`` cuts each vector before ``normalize_embeddings`` rescales it
(sentence-transformers' order), then ``precision`` quantizes it as sentence-transformers' ``quantize_embeddings``
does, with ranges from the artifact's calibration (kiln.runtime.precision); ``convert_to_tensor`` gives one torch
tensor and ``convert_to_numpy=False`` a list of tensors (torch imported only then). ``output_value=
"token_embeddings"`` gives each text's per-token vectors as sentence-transformers does: a torch tensor of (tokens,
dimension) per text, padding left out, special tokens kept. What kiln cannot honour is refused by name, never
ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.errors import UsageError
from kiln.runtime.precision import Precision, parse_precision, quantize, ranges_for, refuse_rejected

if TYPE_CHECKING:
    from kiln.runtime.predictor import Predictor

PROGRESS_CHUNK = 8  # batches per progress-bar step: length grouping still works within a chunk


def encode(
    predictor: Predictor,
    sentences: str | Sequence[str],
    *,
    prompt_name: str | None = None,
    prompt: str | None = None,
    batch_size: int = 32,
    show_progress_bar: bool | None = None,
    output_value: str | None = "sentence_embedding",
    precision: str = "float32",
    convert_to_numpy: bool = True,
    convert_to_tensor: bool = False,
    device: str | None = None,
    normalize_embeddings: bool = False,
    truncate_dim: int | None = None,
) -> Any:
    """Embeddings of ``sentences`` as sentence-transformers returns them (see the module docstring)."""
    if not predictor.handler.embeds:
        raise UsageError(f"encode() needs a sentence-embedding artifact; this one does {predictor.config.task}: "
                         "use predict()")
    _refuse(output_value=output_value, device=device)
    precision = parse_precision(precision)
    single = isinstance(sentences, str)
    texts = [sentences] if single else list(sentences)
    if output_value == "token_embeddings":
        pooled_only = {"truncate_dim": truncate_dim is not None, "normalize_embeddings": normalize_embeddings,
                       "precision": precision is not Precision.FLOAT32}
        if given := [name for name, asked in pooled_only.items() if asked]:
            raise UsageError(f"{', '.join(given)}: applies to sentence embeddings; token embeddings are the "
                             "encoder's vectors as they are")
        states = predictor.with_batch_size(batch_size).predict(texts, tokens=True, prompt_name=prompt_name,
                                                               prompt=prompt)
        torch = _torch("output_value='token_embeddings' returns torch tensors, as sentence-transformers does")
        found = [torch.from_numpy(np.ascontiguousarray(s)) for s in states]
        return found[0] if single else found
    if truncate_dim is not None and truncate_dim < 1:
        raise UsageError(f"truncate_dim must be at least 1 (got {truncate_dim})")
    # the model's named prompts and its default one are chosen by the task (TaskConfig.prompt_text)
    vectors = _embed(predictor.with_batch_size(batch_size), texts, show_progress_bar,
                     {"prompt_name": prompt_name, "prompt": prompt})
    if truncate_dim is not None:
        if len(vectors) and truncate_dim > vectors.shape[1]:
            raise UsageError(f"truncate_dim must be at most the model's size {vectors.shape[1]} (got {truncate_dim})")
        vectors = vectors[:, :truncate_dim]
    if normalize_embeddings:
        vectors = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
    vectors = vectors.astype(np.float32, copy=False)
    if precision is not Precision.FLOAT32 and len(vectors):
        refuse_rejected(predictor.stored_vectors, truncate_dim or vectors.shape[1], precision)
        vectors = quantize(vectors, precision, _ranges(predictor, precision, truncate_dim, normalize_embeddings))
    out = _convert(vectors, convert_to_numpy, convert_to_tensor)
    return out[0] if single and len(texts) else out


def _ranges(predictor: Predictor, precision: Precision, truncate_dim: int | None,
            normalize: bool) -> np.ndarray | None:
    """int8/uint8 ranges from the artifact's calibration vectors, cut and normalised as the vectors were."""
    return ranges_for(precision, predictor.output_calibration, "precision", truncate_dim, normalize)


def _embed(predictor: Predictor, texts: list[str], show_progress_bar: bool | None,
           options: dict[str, Any]) -> np.ndarray:
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    step = predictor.batch_size * PROGRESS_CHUNK
    if not show_progress_bar or len(texts) <= step:
        return np.stack(predictor.predict(texts, **options))
    from rich.progress import Progress

    parts = []
    with Progress(transient=True) as bar:
        task = bar.add_task("Batches", total=len(texts))
        for start in range(0, len(texts), step):
            parts.append(np.stack(predictor.predict(texts[start : start + step], **options)))
            bar.advance(task, len(parts[-1]))
    return np.concatenate(parts)


def _torch(why: str) -> Any:
    try:
        import torch
    except ImportError as err:
        raise UsageError(f"{why}; torch is not installed ({err}): pip install torch") from err
    return torch


def _convert(vectors: np.ndarray, convert_to_numpy: bool, convert_to_tensor: bool) -> Any:
    if convert_to_tensor or not convert_to_numpy:
        torch = _torch("convert_to_tensor / convert_to_numpy=False return torch tensors (or keep the numpy default)")
        if convert_to_tensor:
            return torch.from_numpy(vectors) if len(vectors) else torch.tensor([])
        return list(torch.from_numpy(vectors))
    return vectors if len(vectors) else np.array([])


def _refuse(*, output_value: str | None, device: str | None) -> None:
    """sentence-transformers options kiln does not offer: a clear error, not a silent difference."""
    if output_value not in ("sentence_embedding", "token_embeddings"):
        raise UsageError(f"output_value must be 'sentence_embedding' or 'token_embeddings' (got {output_value!r}); "
                         "None (every output as a dict) is not offered")
    if device not in (None, "cpu"):
        raise UsageError(f"device: the artifact's engine decides where it runs (got {device!r}); load it with "
                         "kiln.load(path, device=...)")


# sentence-transformers' encode_query / encode_document: the model's prompt for the role, unless one is given.
QUERY_PROMPTS = ("query",)
DOCUMENT_PROMPTS = ("document", "passage", "corpus")
# sentence-transformers 6 gives every model these two prompts, empty where the model defines none, so a model with
# only a "passage" prompt encodes documents with none (its "document" comes first).
ROLE_PROMPTS = {"query": "", "document": ""}


def role_prompts(predictor: Predictor) -> dict[str, str]:
    """The prompts as sentence-transformers 6 holds them: the model's, beside an empty query and document."""
    return {**ROLE_PROMPTS, **predictor.config.prompts}


def encode_role(predictor: Predictor, sentences: str | Sequence[str], candidates: Sequence[str],
                **kwargs: Any) -> Any:
    """``encode`` with the first of ``candidates`` among :func:`role_prompts`, where the call gives neither
    ``prompt_name`` nor ``prompt`` (sentence-transformers' rule)."""
    if kwargs.get("prompt_name") is None and kwargs.get("prompt") is None:
        prompts = role_prompts(predictor)
        found = next((name for name in candidates if name in prompts), None)
        if found in predictor.config.prompts:
            kwargs["prompt_name"] = found
        elif found is not None:
            kwargs["prompt"] = prompts[found]  # an empty role prompt: none, and not the default one either
    return encode(predictor, sentences, **kwargs)
