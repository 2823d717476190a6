"""kiln embed: every text of INPUT through an embedding artifact, into ordered Parquet parts in OUTPUT (or through a
late-interaction artifact: each text's token vectors, encoded as a document).

Parts are fixed slices of the input (``rows_per_part`` rows), written whole and in order; within a part, texts
go through the predictor a window at a time, each window sorted by length (little padding) and put back in
input order. A killed job is resumed with ``resume=True``: finished parts are kept, the rest are made. With
``ray`` set the windows run on a Ray cluster (kiln.bulk.on_ray); the parts are the same.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kiln.artifact.directory import Artifact
from kiln.bulk.corpus import Corpus, read_corpus
from kiln.bulk.parts import JobRecord, prepare_output, write_part, write_record
from kiln.errors import UsageError
from kiln.runtime.precision import parse_precision, quantize, ranges_for, refuse_rejected
from kiln.tasks import TASKS, task_spec

Progress = Callable[[int, int], None]  # (texts done, texts in total)


@dataclass(frozen=True)
class EmbedConfig:
    artifact: Path
    input: Path
    output: Path
    text_field: str = "text"
    id_field: str | None = None
    rows_per_part: int = 10_000  # a killed job loses at most one part's work
    window: int = 1024  # texts sorted by length together (bigger: less padding, coarser progress)
    resume: bool = False
    overwrite: bool = False
    variant: str | None = None
    threads: int | None = None  # per engine session (per Ray actor); None: serving.json, else all cores
    ray: str | None = None  # a Ray address ("auto", "ray://host:port") or "local" to start one here
    actors: int | None = None  # Ray actors; None: the cluster's CPUs / threads per actor
    precision: str = "float32"  # the stored vectors' precision (kiln.runtime.precision)

    def __post_init__(self) -> None:
        for flag, value in (("rows_per_part", self.rows_per_part), ("window", self.window),
                            ("intra_op_threads", self.threads or 1), ("actors", self.actors or 1)):
            if value < 1:
                raise UsageError(f"{flag} must be at least 1 (got {value})")
        if self.resume and self.overwrite:
            raise UsageError("resume keeps the finished parts and --force deletes them: pass one of them")


@dataclass(frozen=True)
class EmbedSummary:
    rows: int
    parts: int
    parts_kept: int  # finished before this run (--resume)
    rows_embedded: int  # by this run
    seconds: float
    dimension: int | None

    @property
    def texts_per_second(self) -> float:
        return self.rows_embedded / self.seconds if self.seconds > 0 else 0.0


def artifact_identity(artifact: Artifact, variant: str) -> str:
    """sha256 over the checksums of the variant's files and the tokenizer's: what decides the vectors."""
    prefixes = (artifact.variant(variant).path, artifact.manifest.tokenizer.path)
    digest = hashlib.sha256()
    for name, record in sorted(artifact.manifest.files.items()):
        if name.startswith(prefixes):
            digest.update(f"{name}\0{record.sha256}\n".encode())
    return digest.hexdigest()


def run_embed(config: EmbedConfig, progress: Progress = lambda done, total: None) -> EmbedSummary:
    artifact = Artifact.open(config.artifact)
    task = artifact.task_config.task
    spec = task_spec(task)
    if not (spec.embeds or spec.multi_vectors):
        kinds = ", ".join(name for name, s in TASKS.items() if s.embeds or s.multi_vectors)
        raise UsageError(f"kiln embed needs an artifact of {kinds}; {config.artifact} does {task}")
    variant = artifact.variant_name(config.variant)
    precision = parse_precision(config.precision, "precision")
    refuse_rejected(artifact.manifest.build.stored_vectors, artifact.task_config.dimension, precision)
    # Ranges from the artifact's calibration, checked before any text is embedded (int8/uint8 need them).
    ranges = ranges_for(precision, artifact.output_calibration() if precision.calibrated else None, "precision")
    corpus = read_corpus(config.input, config.text_field, config.id_field)
    record = JobRecord(str(config.input.resolve()), config.input.stat().st_size, config.text_field, config.id_field,
                       str(artifact.path.resolve()), artifact_identity(artifact, variant), variant, len(corpus),
                       config.rows_per_part, artifact.task_config.dimension, precision.value)
    done = prepare_output(config.output, record, resume=config.resume, overwrite=config.overwrite)
    todo = [i for i in range(record.parts) if i not in done]
    start = time.perf_counter()
    counted = [sum(len(_part_rows(record, i)) for i in done)]
    progress(counted[0], len(corpus))

    def advance(texts: int) -> None:
        counted[0] += texts
        progress(counted[0], len(corpus))

    embedded, dimension = 0, record.dimension
    for index, vectors in _vectors_per_part(config, artifact, variant, corpus, record, todo, advance):
        rows = _part_rows(record, index)
        stored = [quantize(v, precision, ranges) for v in vectors] if isinstance(vectors, list) else \
            quantize(vectors, precision, ranges)
        write_part(config.output, index, corpus.ids[rows.start : rows.stop], stored)
        embedded += len(rows)
        if dimension is None:
            dimension = vectors[0].shape[1] if isinstance(vectors, list) else vectors.shape[1]
            write_record(config.output, replace(record, dimension=dimension))
    return EmbedSummary(len(corpus), record.parts, len(done), embedded, time.perf_counter() - start, dimension)


def _part_rows(record: JobRecord, index: int) -> range:
    return range(index * record.rows_per_part, min((index + 1) * record.rows_per_part, record.rows))


def _vectors_per_part(config: EmbedConfig, artifact: Artifact, variant: str, corpus: Corpus, record: JobRecord,
                      todo: list[int], advance: Callable[[int], None]
                      ) -> Iterator[tuple[int, np.ndarray | list[np.ndarray]]]:
    """(part index, its vectors in input order) for each part to make, in order; ``advance(n)`` as texts finish.
    A late-interaction artifact gives a list of [tokens, dim] arrays (its documents' token vectors) instead."""
    parts = [(index, _windows(_part_rows(record, index), config.window)) for index in todo]
    if config.ray is not None:
        from kiln.bulk.on_ray import vectors_on_ray

        yield from vectors_on_ray(config, artifact, variant, corpus, parts, advance)
        return
    predictor = artifact.predictor(variant, artifact.serving_plan(variant, threads=config.threads, split_cores=True))
    multi = task_spec(artifact.task_config.task).multi_vectors
    for index, windows in parts:
        vectors: list[np.ndarray] = []
        for window in windows:
            found = predictor.predict(corpus.texts[window.start : window.stop])  # token vectors: of documents
            vectors += found if multi else [np.stack(found)]
            advance(len(window))
        yield index, vectors if multi else np.concatenate(vectors)


def _windows(rows: range, size: int) -> list[range]:
    return [range(s, min(s + size, rows.stop)) for s in range(rows.start, rows.stop, size)]
