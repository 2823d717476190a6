"""One benchmark target per process: cold start, peak memory and timings are then its own."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kiln.benchmarking.gemm import BF16, FP32, ROWS, fastest_together, gemm_bound
from kiln.choices import Precision, Scheduling
from kiln.decoder.timing import NEW_TOKENS, generation_cell
from kiln.records.bench import GemmBound, SkippedCell, SweepPoint, TargetResult
from kiln.records.timing import GenerationCell, LatencyStats
from kiln.runtime.timing import best_seconds, latency_cell, length_mix_throughput, peak_rss_mb, synthetic_batch
from kiln.tasks import task_handler, task_spec

PYTORCH = "pytorch-fp32"
Cell = TypeVar("Cell")


@dataclass(frozen=True)
class Target:
    name: str  # a variant of the artifact, or PYTORCH for the original model
    artifact: str | None
    model: str | None  # the source model directory for the PyTorch baseline
    task: str


@dataclass(frozen=True)
class BenchSettings:
    batch_sizes: tuple[int, ...]
    seq_lens: tuple[int, ...]
    mix: tuple[str, ...]  # the texts of the length mix
    threads: int
    budget_s: float  # time budget per grid cell
    batch_size: int = 32  # for the length mix
    sweep: tuple[tuple[int, int, int], ...] = ()  # (sessions, threads per session, batch size)
    pad_multiples: tuple[int, ...] = ()  # then tried at the best sweep point, besides the engine's own
    min_runs: int = 5
    mix_rounds: int = 2  # best of this many passes over the length mix
    new_tokens: int = NEW_TOKENS  # decoders: tokens generated per cell (seq_lens are then prompt lengths)
    generation_runs: int = 3  # decoders: median of this many timed generations per cell


def _build(target: Target, threads: int):
    """(encoder, task config, engine) for the target, its engine created with ``threads``."""
    from kiln.engines import EngineOptions

    if target.name == PYTORCH:
        from kiln.source.loading import load_source
        from kiln.source.reference import set_vanilla_attention

        source = load_source(target.model, target.task)
        set_vanilla_attention(source.model)  # the vanilla model, as users run it
        return BASELINES[task_spec(target.task).scheduling](source, threads)
    from kiln.artifact.directory import Artifact

    art = Artifact.open(target.artifact, check=False)  # verified once by the parent
    engine = art.engine(target.name, EngineOptions.for_variant(art.variant(target.name), threads))
    return art.encoder(), art.task_config, engine


def _torch_baseline(source, threads: int):
    """The task module run eagerly, as users run the model."""
    from kiln.engines import EngineOptions
    from kiln.engines.torch_eager import TorchEngine
    from kiln.source.reference import source_encoder, task_module

    engine = TorchEngine(task_module(source), EngineOptions(intra_op_threads=threads))
    return source_encoder(source), source.task_config, engine


def _step_graph_baseline(source, threads: int):
    """The step graph with the KV cache run eagerly: the same work per token as the exported variants."""
    from kiln.source.reference import timing_predictor

    reference = timing_predictor(source, threads=threads)
    return reference.encoder, reference.config, reference.raw_engine


# How a task is scheduled -> its PyTorch fp32 baseline, (encoder, task config, engine).
BASELINES: dict[Scheduling, Callable[..., tuple]] = {Scheduling.BATCH: _torch_baseline,
                                                     Scheduling.DECODE: _step_graph_baseline}


def _walk_grid(settings: BenchSettings, too_long: Callable[[int], str | None], measure: Callable[[int, int], Cell],
               report) -> tuple[list[Cell], list[SkippedCell]]:
    """Every sequence length x batch size in settings' order: a cell measured, or skipped with too_long's reason."""
    cells: list[Cell] = []
    skipped: list[SkippedCell] = []
    for length in settings.seq_lens:
        for batch_size in settings.batch_sizes:
            reason = too_long(length)
            if reason is None:
                cells.append(measure(batch_size, length))
            else:
                skipped.append(SkippedCell(batch_size, length, reason))
            report("cell", None)
    return cells, skipped


def run_generation_target(target: Target, settings: BenchSettings, report=lambda kind, detail: None
                          ) -> TargetResult:
    """A decoder: time to first token and per-token latency per batch size x prompt length (bench/generation.py)."""
    from kiln.runtime.predictor import Predictor

    start = time.perf_counter()
    encoder, config, engine = _build(target, settings.threads)
    steps = Predictor(task_handler(config), encoder, engine).engine.steps  # the task's view of the graph: a stepper
    warm_prompt = synthetic_batch(encoder, 1, 4)["input_ids"]
    generation_cell(steps, encoder.pad_id, warm_prompt, new_tokens=2, runs=1, decode=encoder.decode, warmup=0)
    load_seconds = time.perf_counter() - start
    report("loaded", load_seconds)

    def too_long(length: int) -> str | None:
        if length + settings.new_tokens <= encoder.max_length:
            return None
        return f"{length} prompt tokens + {settings.new_tokens} new pass the model's window of {encoder.max_length}"

    def measure(batch_size: int, length: int) -> GenerationCell:
        prompts = synthetic_batch(encoder, batch_size, length)["input_ids"]
        return generation_cell(steps, encoder.pad_id, prompts, new_tokens=settings.new_tokens,
                               runs=settings.generation_runs, decode=encoder.decode)

    cells, skipped = _walk_grid(settings, too_long, measure, report)
    return TargetResult(target.name, load_seconds, peak_rss_mb(), skipped_cells=tuple(skipped),
                        generation=tuple(cells))


def run_target(target: Target, settings: BenchSettings, report=lambda kind, detail: None) -> TargetResult:
    """Time one target the way its task is scheduled (RUNNERS)."""
    return RUNNERS[task_spec(target.task).scheduling](target, settings, report)


def run_batch_target(target: Target, settings: BenchSettings, report=lambda kind, detail: None) -> TargetResult:
    """A one-pass task: the latency grid, the length mix, the GEMM bound and the sessions x threads sweep."""
    from kiln.runtime.predictor import Predictor

    start = time.perf_counter()
    encoder, config, engine = _build(target, settings.threads)
    predictor = Predictor(task_handler(config), encoder, engine, batch_size=settings.batch_size)
    predictor.predict([task_spec(config.task).sample_input(settings.mix[0])])
    load_seconds = time.perf_counter() - start
    report("loaded", load_seconds)

    def too_long(seq_len: int) -> str | None:
        return f"longer than the model's {encoder.max_length} tokens" if seq_len > encoder.max_length else None

    def measure(batch_size: int, seq_len: int) -> LatencyStats:
        batch = synthetic_batch(encoder, batch_size, seq_len)
        return latency_cell(engine.run, batch, budget_s=settings.budget_s, min_runs=settings.min_runs)

    grid, skipped = _walk_grid(settings, too_long, measure, report)
    spec = task_spec(config.task)
    encodings = predictor.prepare([spec.sample_input(text) for text in settings.mix]).encodings
    mix = length_mix_throughput(predictor, encodings, rounds=settings.mix_rounds)
    report("mix", None)
    gemm = _gemm_bound(target, engine, encoder, settings) if target.name != PYTORCH else None
    report("gemm", None)
    rss = peak_rss_mb()  # before the sweep, which holds several sessions at once
    sweep = []
    # The sweep picks how to serve a variant; the PyTorch baseline is timed as users run it, not tuned.
    for sessions, threads, batch_size in settings.sweep if target.artifact and target.name != PYTORCH else ():
        sweep.append(_sweep_point(target, settings, encodings, sessions, threads, batch_size))
        report("sweep", None)
    if sweep:
        best = max(sweep, key=lambda p: p.sorted_per_s)
        for multiple in settings.pad_multiples:
            if multiple != best.pad_multiple:
                sweep.append(_sweep_point(target, settings, encodings, best.sessions, best.threads, best.batch_size,
                                          multiple))
            report("sweep", None)
    return TargetResult(target.name, load_seconds, rss, tuple(grid), tuple(skipped), mix, tuple(sweep), gemm)


def _gemm_bound(target: Target, engine, encoder, settings: BenchSettings) -> GemmBound | None:
    """The variant's throughput at 32 x 128 tokens against its weight GEMMs timed alone (bench/gemm.py): as one
    session of all threads, and, where kiln.load splits the cores (split_cores_plan), as the streams it runs, each
    on its own batch; the GEMMs are timed the same ways, and the faster of each counts."""
    from kiln.artifact.directory import Artifact, split_cores_plan
    from kiln.engines import EngineOptions, open_sessions

    length = ROWS // 32
    if encoder.max_length < length:
        return None
    art = Artifact.open(target.artifact, check=False)
    record = art.variant(target.name)
    batch = synthetic_batch(encoder, 32, length)
    ways = {f"1 x {settings.threads}": [engine]}
    if settings.threads > 1 and split_cores_plan(record.engine, target.task, "cpu") is not None:
        # the streams kiln.load runs: as many as the runtime's throughput hint picks on these threads
        streams = open_sessions(record.engine, art.path / record.path,
                                EngineOptions.for_variant(record, settings.threads), None)
        if len(streams) > 1:
            ways[f"{len(streams)} x {max(1, settings.threads // len(streams))}"] = streams

    def fastest() -> tuple[float, str]:
        """Sequences/s of the variant's fastest round, and the way that reached it: the statistic the bound takes
        of its GEMMs, timed on both sides of the bound so that both see the machine at its best. This VM's speed
        moves by up to 2x within a minute; the median of the variant's calls against the fastest of the GEMMs'
        read the fraction low."""
        return max((32 / fastest_together([lambda e=e: e.run(batch) for e in sessions], budget_s=settings.budget_s,
                                          min_runs=settings.min_runs), way) for way, sessions in ways.items())

    native = _native_bf16()
    # An artifact built on a bf16 CPU keeps its bf16 hint elsewhere, where OpenVINO runs those GEMMs in fp32.
    runs_bf16 = native and record.engine == "openvino" and record.options.precision is Precision.BF16
    before = fastest()
    bound = gemm_bound(art.path / record.path, before[0], settings.threads, bf16=native,
                       float_precision=BF16 if runs_bf16 else FP32, budget_s=settings.budget_s * 3,
                       min_runs=settings.min_runs, streams=tuple(len(sessions) for sessions in ways.values()))
    return bound.with_reached(*max(before, fastest())) if bound else None


def _native_bf16() -> bool:
    """Whether the bound is also timed in bf16: the CPU has native bf16 and OpenVINO (which times it) is here."""
    from importlib.util import find_spec

    from kiln.system.cpu import cpu_info

    return cpu_info().has_bf16 and find_spec("openvino") is not None


def _sweep_point(target: Target, settings: BenchSettings, encodings, sessions: int, threads: int,
                 batch_size: int, pad_multiple: int | None = None) -> SweepPoint:
    """Throughput of ``sessions`` engine sessions with ``threads`` each, fed sorted batches side by side: the
    predictor ``kiln.load`` builds from the winning point (OpenVINO: one model compiled with a stream per
    session)."""
    from kiln.artifact.directory import Artifact
    from kiln.artifact.plan import ServingPlan
    from kiln.engines import EngineOptions

    art = Artifact.open(target.artifact, check=False)  # verified once by the parent
    options = EngineOptions.for_variant(art.variant(target.name), threads)
    predictor = art.predictor(target.name, ServingPlan(options, sessions, batch_size, pad_multiple))
    shortest = sorted(encodings, key=lambda e: len(e.ids))[: sessions * batch_size]
    predictor.run_features(shortest)  # one batch per session: each session's first call is not timed
    # best of the mix's rounds: one pass over the mix varied by up to 10% on a shared 2-core VM
    seconds = best_seconds(predictor, encodings, rounds=settings.mix_rounds)
    latency = latency_cell(predictor.engine.run, synthetic_batch(predictor.encoder, 1, 128),
                           budget_s=settings.budget_s, min_runs=settings.min_runs)
    return SweepPoint(sessions, threads, len(encodings) / seconds, latency.median_ms, batch_size,
                      predictor.pad_multiple)


# How a task's requests are scheduled (TaskSpec.scheduling) -> how a target of it is timed.
RUNNERS: dict[Scheduling, Callable[..., TargetResult]] = {Scheduling.BATCH: run_batch_target,
                                                          Scheduling.DECODE: run_generation_target}


def worker_main(conn, target: Target, settings: BenchSettings) -> None:
    """Entry point of a spawned worker: send progress events, then the result (or the error text)."""
    try:
        result = run_target(target, settings, lambda kind, detail: conn.send(("progress", kind, detail)))
        conn.send(("done", result))
    except Exception as err:  # reported to the parent, which records and prints it
        conn.send(("done", TargetResult(target.name, error=f"{type(err).__name__}: {err}")))
