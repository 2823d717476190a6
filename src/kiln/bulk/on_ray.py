"""kiln embed on Ray Data: the same windows and parts, run by an actor pool with one kiln predictor per actor.

Every window of the parts still to make is one Ray block; ``map_batches`` sends each to an actor holding the
artifact's predictor (threads per actor from serving.json unless --threads), and with ``preserve_order`` the
results stream back in input order, so the driver writes exactly the parts a single process would.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kiln.artifact.directory import Artifact
from kiln.bulk.corpus import Corpus, pyarrow_module
from kiln.errors import UsageError
from kiln.tasks import task_spec

LOCAL = "local"  # --ray local: start a Ray instance on this machine


def ray_module() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401 - Ray Data is the [data] extra of ray
    except ImportError as err:
        raise UsageError(f"kiln embed --ray needs Ray Data, which is not installed ({err}): "
                         "pip install 'kiln[ray]'") from err
    return ray


class Embedder:
    """A Ray actor's state: one predictor, loaded once, embedding one window per call."""

    def __init__(self, path: str, variant: str, threads: int) -> None:
        artifact = Artifact.open(path)
        self.predictor = artifact.predictor(variant, artifact.serving_plan(variant, threads=threads))
        self.multi = task_spec(artifact.task_config.task).multi_vectors

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        found = [v.astype(np.float32) for v in self.predictor.predict([str(t) for t in batch["text"]])]
        if not self.multi:
            return {"vector": np.stack(found)}
        ragged = np.empty(len(found), dtype=object)  # a late-interaction model's [tokens, dim] per text: Ray Data
        ragged[:] = found  # carries them as a variable-shaped tensor column
        return {"vector": ragged}


def vectors_on_ray(config: Any, artifact: Artifact, variant: str, corpus: Corpus,
                   parts: list[tuple[int, list[range]]], advance: Callable[[int], None]
                   ) -> Iterator[tuple[int, np.ndarray | list[np.ndarray]]]:
    ray = ray_module()
    started = not ray.is_initialized()
    if started:
        _connect(ray, config.ray)
    try:
        yield from _run(ray, config, artifact, variant, corpus, parts, advance)
    finally:
        if started:
            ray.shutdown()


def _connect(ray: Any, address: str) -> None:
    try:
        if address == LOCAL:
            ray.init(num_cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                     include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise UsageError(f"ray {address}: cannot connect to a Ray cluster ({err}); use --ray local to start one "
                         "here, or the address `ray start --head` printed") from err


def _run(ray: Any, config: Any, artifact: Artifact, variant: str, corpus: Corpus,
         parts: list[tuple[int, list[range]]], advance: Callable[[int], None]
         ) -> Iterator[tuple[int, np.ndarray | list[np.ndarray]]]:
    pa = pyarrow_module()
    default = artifact.serving_default(variant)
    threads = config.threads or (default.threads if default else None) or 1
    cpus = int(ray.cluster_resources().get("CPU", 1))
    actors = config.actors or max(1, cpus // threads)
    if actors * threads > cpus:  # Ray would wait for CPUs that never come: refuse instead of hanging
        raise UsageError(f"actors {actors} x --threads {threads} needs {actors * threads} CPUs; the Ray cluster has "
                         f"{cpus}")
    windows = [w for _, ws in parts for w in ws]
    if not windows:
        return
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # parts are written in input order
    context.enable_progress_bars = False  # kiln embed shows its own bar; Ray's would interleave with it
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    blocks = [pa.table({"text": corpus.texts[w.start : w.stop]}) for w in windows]
    dataset = ray.data.from_arrow(blocks).map_batches(
        Embedder, fn_constructor_kwargs={"path": str(artifact.path), "variant": variant, "threads": threads},
        batch_size=config.window, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=threads)
    multi = task_spec(artifact.task_config.task).multi_vectors
    pending = iter(parts)
    index, part_windows = next(pending)
    need, rows = sum(len(w) for w in part_windows), []
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        advance(len(batch["vector"]))
        rows += list(batch["vector"])
        while len(rows) >= need:
            yield index, rows[:need] if multi else np.stack(rows[:need])
            rows = rows[need:]
            if (nxt := next(pending, None)) is None:
                break
            index, part_windows = nxt
            need = sum(len(w) for w in part_windows)
