"""kiln distill --static: a static-embedding model distilled from a sentence-embedding teacher.

A static model is a table with one vector per vocabulary token; a text's vector is the mean of its tokens' rows
(then normalised when the teacher normalises). It runs as one table lookup and a mean: no attention, no matrix
multiply per token, a hundred times and more faster than any transformer on a CPU, at a cost in quality that
``kiln optimize STATIC --reference TEACHER`` (or the benchmark) measures.

The recipe is model2vec's, written for kiln (as sentence-transformers' ``StaticEmbedding.from_distillation`` runs
model2vec's):
1. every vocabulary token except special and ``[unusedN]`` tokens goes through the teacher alone, with the
   tokenizer's special tokens around it, and is pooled the way the teacher pools a sentence: its row is the
   teacher's embedding of that one token;
2. the rows are centred and projected on their first ``dims`` principal components (PCA by SVD), which also
   decorrelates them;
3. each row is weighted by SIF, ``a / (a + p)``, with the token's probability ``p`` from Zipf's law over the
   vocabulary order (the tokenizers list frequent pieces first): frequent tokens, which say little, weigh less.

Written as sentence-transformers saves a StaticEmbedding model (modules.json, model.safetensors with
``embedding.weight``, tokenizer.json; a Normalize module when the teacher normalises), so
``SentenceTransformer(path)`` loads it, with a lineage file naming the teacher and the recipe, and with a kiln
artifact in ``artifact/`` (:func:`write_artifact`: the table as the ``static`` engine's one variant, a tokenizer
that adds no special tokens) that ``kiln serve``, ``kiln.load().encode()`` and ``kiln embed`` run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.records import write_json

LINEAGE_FILE = "kiln-static.json"
ARTIFACT_DIR = "artifact"  # the kiln artifact inside the written model directory
MAX_TOKENS = 8192  # the artifact's max_length: a static model has no position limit; longer texts are cut
LINEAGE_SCHEMA = "kiln.static/1"
UNUSED = re.compile(r"^\[unused\d+\]$")
ST_STATIC = "sentence_transformers.sentence_transformer.modules.static_embedding.StaticEmbedding"
ST_NORMALIZE = "sentence_transformers.base.modules.normalize.Normalize"


@dataclass(frozen=True)
class StaticConfig:
    teacher: str | None  # model directory or hub id; None: the bundled MiniLM
    output: Path
    dims: int | None = 256  # principal components kept; None: the teacher's size
    sif: float = 1e-4  # SIF coefficient a in a / (a + p)
    batch_size: int = 512  # tokens through the teacher at once
    overwrite: bool = False
    allow_pickle: bool = False

    def __post_init__(self) -> None:
        if self.dims is not None and self.dims < 1:
            raise UsageError(f"dims must be at least 1 (got {self.dims})")
        if not self.sif > 0:
            raise UsageError(f"sif must be above 0 (got {self.sif:g})")
        if self.batch_size < 1:
            raise UsageError(f"batch_size must be at least 1 (got {self.batch_size})")


@dataclass(frozen=True)
class StaticResult:
    output: Path
    teacher: str
    vocabulary: int  # rows of the table
    distilled: int  # tokens that went through the teacher (the rest are zero rows)
    dims: int
    explained_variance: float  # share of the token vectors' variance the kept components hold
    seconds: float
    teacher_parameters: int = 0


def kept_tokens(tokenizer: Any) -> list[int]:
    """Token ids that get a row: every one but the special and ``[unusedN]`` tokens, in id order."""
    special = set(tokenizer.all_special_ids)
    vocab = tokenizer.get_vocab()
    return sorted(i for token, i in vocab.items() if i not in special and not UNUSED.match(token))


def token_vectors(source: Any, ids: list[int], batch_size: int,
                  progress: Callable[[int, int], None] = lambda done, total: None) -> np.ndarray:
    """The teacher's sentence embedding of each token alone (special tokens around it, pooled as configured,
    before normalisation)."""
    import torch

    from kiln.tasks.feature_extraction.task import POOLERS

    tokenizer, model = source.tokenizer, source.model
    pool = POOLERS[source.task_config.pooling]
    template = _template(tokenizer)
    rows = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        input_ids = torch.tensor([[i if t == -1 else t for t in template] for i in chunk])
        mask = torch.ones_like(input_ids)
        features = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in source.input_names:
            features["token_type_ids"] = torch.zeros_like(input_ids)
        with torch.inference_mode():
            hidden = model(**features).last_hidden_state.float().numpy()
        rows.append(pool(hidden, mask.numpy()))
        progress(start + len(chunk), len(ids))
    return np.concatenate(rows).astype(np.float32)


def _template(tokenizer: Any) -> list[int]:
    """The tokenizer's special tokens around one token, -1 where the token goes: the ids themselves go in (decoding
    a piece and encoding it again may split it differently)."""
    probe = tokenizer("a", add_special_tokens=False)["input_ids"]
    if len(probe) != 1:
        raise UsageError("kiln distill --static needs a tokenizer that encodes 'a' as one token")
    return [-1 if i == probe[0] else i for i in tokenizer("a")["input_ids"]]


def principal_components(vectors: np.ndarray, dims: int) -> tuple[np.ndarray, float]:
    """``vectors`` centred and projected on their first ``dims`` principal components (each component's sign
    fixed so its largest loading is positive: the same table on every run), and the variance share kept."""
    centred = vectors - vectors.mean(axis=0)
    _, singular, components = np.linalg.svd(centred.astype(np.float64), full_matrices=False)
    dims = min(dims, components.shape[0])
    components = components[:dims]
    signs = np.sign(components[np.arange(dims), np.abs(components).argmax(axis=1)])
    components = components * signs[:, None]
    explained = float((singular[:dims] ** 2).sum() / max((singular**2).sum(), 1e-30))
    return (centred @ components.T).astype(np.float32), explained


def sif_weights(count: int, coefficient: float) -> np.ndarray:
    """SIF weight of the token at each rank 1..count, its probability from Zipf's law (p ~ 1 / rank)."""
    ranks = np.arange(1, count + 1, dtype=np.float64)
    probability = (1 / ranks) / (1 / ranks).sum()
    return (coefficient / (coefficient + probability)).astype(np.float32)


def distill_static(config: StaticConfig, progress: Callable[[str], None] = lambda _: None) -> StaticResult:
    """Distil and write the static model (atomically); what it holds."""
    from kiln.artifact.staging import staged_directory
    from kiln.source.loading import load_source
    from kiln.tasks import DEFAULT_TASK

    start = time.perf_counter()
    source = load_source(config.teacher, DEFAULT_TASK, allow_pickle=config.allow_pickle)
    ids = kept_tokens(source.tokenizer)
    progress(f"running {len(ids)} vocabulary tokens through {source.name}")
    vectors = token_vectors(source, ids, config.batch_size)
    dims = min(config.dims or vectors.shape[1], vectors.shape[1])
    reduced, explained = principal_components(vectors, dims)
    reduced *= sif_weights(len(ids), config.sif)[:, None]
    backend = source.tokenizer.backend_tokenizer
    table = np.zeros((backend.get_vocab_size(), dims), dtype=np.float32)
    table[ids] = reduced
    with staged_directory(config.output, overwrite=config.overwrite) as stage:
        _write(stage, table, backend, source, config, explained)
        write_artifact(stage / ARTIFACT_DIR, table, backend, source, config)
    return StaticResult(config.output, source.name, table.shape[0], len(ids), dims, explained,
                        time.perf_counter() - start, source.describe().parameters)


def _write(directory: Path, table: np.ndarray, backend: Any, source: Any, config: StaticConfig,
           explained: float) -> None:
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(backend.to_str())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.save(str(directory / "tokenizer.json"))
    save_file({"embedding.weight": table}, str(directory / "model.safetensors"))
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST_STATIC}]
    if source.task_config.normalize:
        (directory / "1_Normalize").mkdir()
        (directory / "1_Normalize" / "config.json").write_text("{}")
        modules.append({"idx": 1, "name": "1", "path": "1_Normalize", "type": ST_NORMALIZE})
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "config_sentence_transformers.json").write_text(json.dumps(
        {"model_type": "SentenceTransformer", "similarity_fn_name": "cosine", "prompts": {},
         "default_prompt_name": None}, indent=2))
    write_json(directory / LINEAGE_FILE, LINEAGE_SCHEMA, {
        "teacher": source.name, "teacher_sha256": source.content_sha256, "recipe": asdict(config) | {
            "output": str(config.output)}, "explained_variance": explained,
        "normalize": source.task_config.normalize, "pooling": str(source.task_config.pooling)})
    (directory / "README.md").write_text(
        f"# Static embeddings distilled from {source.name}\n\nkiln distill --static: every vocabulary token through "
        f"the teacher alone, PCA to {table.shape[1]} dimensions ({explained:.1%} of the variance), SIF weights "
        f"(a = {config.sif:g}) from Zipf's law. A text is the mean of its tokens' rows"
        f"{', normalised' if source.task_config.normalize else ''}.\n\n```python\nfrom sentence_transformers import "
        "SentenceTransformer\nmodel = SentenceTransformer(PATH)\n```\n")


class StaticModel:
    """A written static model, loaded once: ``encode`` is what sentence-transformers computes (the mean of each
    text's token rows, normalised when the model has a Normalize module), in numpy."""

    def __init__(self, directory: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.table = load_file(str(directory / "model.safetensors"))["embedding.weight"]
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        modules = json.loads((directory / "modules.json").read_text())
        self.normalize = any(m["type"].endswith("Normalize") for m in modules)

    def encode(self, texts: list[str]) -> np.ndarray:
        ids = [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]  # no offsets needed
        counts = np.array([len(i) for i in ids])
        flat = np.fromiter((t for row in ids for t in row), dtype=np.int64, count=int(counts.sum()))
        # One gather and one segmented sum for the whole batch (an empty text is a zero vector, as EmbeddingBag's).
        sums = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        present = counts > 0
        if present.any():
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[present]
            sums[present] = np.add.reduceat(self.table[flat], starts, axis=0)
        vectors = sums / np.maximum(counts, 1)[:, None]
        if self.normalize:
            vectors = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
        return vectors


def write_artifact(directory: Path, table: np.ndarray, backend: Any, source: Any, config: StaticConfig) -> None:
    """The static model as a kiln artifact: the table as the ``static`` engine's variant, the teacher's tokenizer
    without its special tokens (sentence-transformers' StaticEmbedding encodes without them), mean pooling, the
    teacher's normalisation."""
    import dataclasses

    from tokenizers import Tokenizer

    from kiln.artifact.manifest import Manifest, seal
    from kiln.choices import Pooling
    from kiln.records.artifact import BuildRecord, SourceRecord, TokenizerRecord, VariantRecord
    from kiln.source.loading import pad_token_id
    from kiln.system.hashing import sha256_file

    (directory / "tokenizer").mkdir(parents=True)
    (directory / "static").mkdir()
    tokenizer = Tokenizer.from_str(backend.to_str())
    tokenizer.post_processor = None  # no [CLS]/[SEP]: the mean is over the text's own tokens
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.save(str(directory / "tokenizer" / "tokenizer.json"))
    np.save(directory / "static" / "table.npy", table, allow_pickle=False)
    task = dataclasses.replace(source.task_config, max_length=MAX_TOKENS, pooling=Pooling.MEAN,
                               dimension=table.shape[1], matryoshka_dims=())
    variant = VariantRecord("static", "static", "static/table.npy", ("static/table.npy",),
                            recipe=({"pass": "distill-static", "dims": table.shape[1], "sif": config.sif},),
                            reason="a static student: judge it against its teacher with kiln optimize --reference")
    seal(directory, Manifest(
        source=SourceRecord(model=f"static student of {source.name}", path=str(config.output),
                            content_sha256=sha256_file(directory / "static" / "table.npy"), model_type="static",
                            architecture="StaticEmbedding", parameters=int(table.size)),
        task=task, variants={"static": variant},
        tokenizer=TokenizerRecord("tokenizer/tokenizer.json", pad_token_id(source), ("input_ids", "attention_mask")),
        build=BuildRecord(best="static")))


def encode_static(directory: Path, texts: list[str]) -> np.ndarray:
    """A written static model's vectors (loads it each call: see :class:`StaticModel` to load once)."""
    return StaticModel(directory).encode(texts)
