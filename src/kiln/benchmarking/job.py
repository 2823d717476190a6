"""kiln bench: run every target in its own process, collect, pick the serving default, write the report."""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.artifact.manifest import MANIFEST_NAME, read_manifest, seal, verify
from kiln.benchmarking.environment import fingerprint
from kiln.benchmarking.worker import PYTORCH, BenchSettings, Target, worker_main
from kiln.choices import Scheduling
from kiln.data.texts import texts_of_lengths
from kiln.decoder import timing as decoder_timing
from kiln.errors import UsageError
from kiln.records import to_jsonable, write_json
from kiln.records.artifact import ServingDefault, Status
from kiln.records.bench import (
    RESULTS_FILE,
    SCHEMA,
    BenchResults,
    OptimizeSection,
    ServingRecord,
    SettingsRecord,
    TargetResult,
)
from kiln.system.children import ChildDied, receive
from kiln.system.cpu import cpu_info
from kiln.system.invocation import invocation
from kiln.tasks import DEFAULT_TASK, task_spec

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_SEQ_LENS = (16, 32, 64, 128, 256, 512)
QUICK_GENERATION = {"seq_lens": (4, 64), "runs": 1}
QUICK = {"batch_sizes": (1, 8, 32), "seq_lens": (16, 128), "budget_s": 0.05, "mix": 128, "min_runs": 3,
         "mix_rounds": 1}
SERVING_FILE = "serving.json"
WORKER_SILENCE_S = 600.0  # a live worker that reports nothing for this long is stuck: killed and reported


@dataclass(frozen=True)
class BenchConfig:
    target: str | None  # artifact directory or model directory; None: the bundled model
    output: Path
    variants: tuple[str, ...] | None = None  # default: the artifact's best (and every accepted with "all")
    batch_sizes: tuple[int, ...] | None = None
    seq_lens: tuple[int, ...] | None = None
    texts_file: Path | None = None
    lengths_file: Path | None = None
    threads: int | None = None
    quick: bool = False
    task: str = DEFAULT_TASK
    baseline: bool = True
    sweep: bool = True


def _read_lines(path: Path, flag: str) -> list[str]:
    if not path.expanduser().is_file():
        raise UsageError(f"{flag} file {path} does not exist")
    lines = [line.strip() for line in path.expanduser().read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise UsageError(f"{flag} file {path} is empty")
    return lines


def _mix(config: BenchConfig, encoder, count: int) -> tuple[str, ...]:
    if config.texts_file:
        return tuple(_read_lines(config.texts_file, "texts"))
    if config.lengths_file:
        lines = _read_lines(config.lengths_file, "lengths")
        try:
            lengths = [int(x) for x in lines]
        except ValueError as err:
            raise UsageError(f"lengths file {config.lengths_file}: one integer token count per line ({err})") \
                from err
        if min(lengths) < 3:
            raise UsageError(f"lengths file {config.lengths_file}: lengths must be at least 3 tokens")
        return tuple(texts_of_lengths(lengths, token_count=encoder.token_count))
    from kiln.data.texts import length_mix

    return tuple(length_mix(count, 10, min(200, encoder.max_length), seed=3, token_count=encoder.token_count))


SWEEP_BATCH_SIZES = (8, 16, 32)
# Tried at the best (sessions, threads, batch size): coarser buckets mean more padding but fewer distinct shapes,
# which runtimes that compile per shape (OpenVINO's CPU plugin) reuse.
SWEEP_PAD_MULTIPLES = (1, 8, 16, 32)


def sweep_points(cores: int, batch_sizes: tuple[int, ...] = SWEEP_BATCH_SIZES) -> tuple[tuple[int, int, int], ...]:
    """(sessions, threads each, batch size): every thread count alone, and the cores split across sessions,
    each at every batch size. Several sessions with smaller batches can beat one session using every core
    (2 x 1 thread with batches of 16 ran 1.19x 1 x 2 with 32 on one CPU of this project): it is measured."""
    points = [(1, t) for t in sorted({1, *range(2, cores + 1, max(1, cores // 4))} | {cores})]
    points += [(s, cores // s) for s in (2, 4) if cores // s >= 1 and s <= cores]
    return tuple((s, t, b) for s, t in dict.fromkeys(points) for b in batch_sizes)


class BenchJob:
    def __init__(self, config: BenchConfig, progress: Callable[[str], None] = lambda _: None,
                 make_bar: Callable[[int], Any] | None = None) -> None:
        self.config = config
        self.progress = progress
        self.make_bar = make_bar

    def _targets(self) -> tuple[list[Target], Any, dict[str, Any] | None]:
        cfg = self.config
        path = Path(cfg.target).expanduser() if cfg.target else None
        if path is not None and (path / MANIFEST_NAME).is_file():
            from kiln.artifact.directory import Artifact

            art = Artifact.open(path)
            plan = PLANS[task_spec(art.task_config.task).scheduling]
            names = list(cfg.variants) if cfg.variants else \
                list(art.manifest.variants) if plan.every_variant else [art.variant_name()]
            if names == ["all"]:
                names = [n for n, r in art.manifest.variants.items() if r.status is Status.ACCEPTED]
            for name in names:
                art.variant_name(name)  # a clear error for an unknown variant
            source_dir = art.manifest.source.path
            model = source_dir if source_dir and Path(source_dir).is_dir() else None
            targets = [Target(n, str(path), None, art.task_config.task) for n in names]
            if cfg.baseline and model:
                targets.insert(0, Target(PYTORCH, str(path), model, art.task_config.task))
            elif cfg.baseline:
                self.progress(f"PyTorch baseline skipped: the source model {source_dir} is not on this machine")
            return targets, art, art.manifest
        if cfg.variants:
            raise UsageError("variants needs an artifact directory (written by kiln optimize or kiln export)")
        return [Target(PYTORCH, None, cfg.target, cfg.task)], None, None

    def run(self) -> BenchResults:
        cfg = self.config
        targets, artifact, manifest = self._targets()
        encoder = artifact.encoder() if artifact else _source_encoder(cfg)
        cores = cpu_info().usable_cores
        threads = cfg.threads or cores
        task = artifact.task_config.task if artifact else cfg.task
        settings = PLANS[task_spec(task).scheduling].settings(self, encoder, cores, threads)
        steps = len(targets) * (3 + len(settings.batch_sizes) * len(settings.seq_lens))
        steps += sum(len(settings.sweep) + len(settings.pad_multiples) for t in targets if t.name != PYTORCH)
        bar = self.make_bar(steps) if self.make_bar else None
        measured = [self._run_one(t, settings, bar) for t in targets]
        if bar is not None:
            bar.close()
        serving = self._serving_default(measured, artifact)
        out = BenchResults(
            model=manifest.source.model if manifest else (cfg.target or "bundled all-MiniLM-L6-v2"), task=task,
            command=invocation(), environment=fingerprint(), artifact=str(artifact.path) if artifact else None,
            settings=SettingsRecord.of(settings), targets=tuple(measured),
            optimize=OptimizeSection.of(manifest) if manifest else None, serving_default=serving)
        cfg.output.mkdir(parents=True, exist_ok=True)
        write_json(cfg.output / RESULTS_FILE, SCHEMA, out)  # atomic, as every kiln record
        from kiln.report.html import write_report

        write_report(cfg.output, out)
        return out

    def _settings(self, encoder, cores: int, threads: int) -> BenchSettings:
        """An encoder's grid, length mix and thread sweep."""
        cfg = self.config
        quick = QUICK if cfg.quick else {}
        return BenchSettings(
            batch_sizes=cfg.batch_sizes or quick.get("batch_sizes", DEFAULT_BATCH_SIZES),
            seq_lens=cfg.seq_lens or quick.get("seq_lens", DEFAULT_SEQ_LENS),
            mix=_mix(cfg, encoder, quick.get("mix", 512)), threads=threads,
            budget_s=quick.get("budget_s", 0.3), min_runs=quick.get("min_runs", 5),
            mix_rounds=quick.get("mix_rounds", 2),
            sweep=() if cfg.quick or not cfg.sweep else sweep_points(cores),
            pad_multiples=() if cfg.quick or not cfg.sweep else SWEEP_PAD_MULTIPLES,
        )

    def _generation_settings(self, encoder, cores: int, threads: int) -> BenchSettings:
        """A decoder's grid: batch sizes x prompt lengths, each cell generating NEW_TOKENS tokens. No length mix and
        no sweep: a decoder is served by continuous batching, not by an encoder's batch-and-padding plan."""
        cfg = self.config
        for flag, value in (("texts", cfg.texts_file), ("lengths", cfg.lengths_file)):
            if value is not None:
                raise UsageError(f"{flag} builds an encoder's length mix; a decoder is timed on prompts of "
                                 "--seq-lens tokens")
        quick = QUICK_GENERATION if cfg.quick else {}
        return BenchSettings(
            batch_sizes=cfg.batch_sizes or decoder_timing.DEFAULT_BATCH_SIZES,
            seq_lens=cfg.seq_lens or quick.get("seq_lens", decoder_timing.DEFAULT_PROMPT_LENGTHS),
            mix=(), threads=threads, budget_s=0.0, generation_runs=quick.get("runs", 3))

    def _run_one(self, target: Target, settings: BenchSettings, bar) -> TargetResult:
        """Run one target in a spawned process; its progress events advance the bar. The worker is watched by its
        sentinel: killed (the OOM killer, a native crash) it is reported at once with how it died."""
        self.progress(f"benchmarking {target.name}")
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        process = ctx.Process(target=worker_main, args=(child, target, settings), daemon=True)
        process.start()
        child.close()  # only the worker holds the sending end now: its death closes the pipe
        last = "starting"
        try:
            while True:
                message = receive(parent, process, WORKER_SILENCE_S)
                if message[0] == "done":
                    result = message[1]
                    break
                last = f"{message[1]} {message[2]}".strip()
                if bar is not None:
                    bar.advance()
        except TimeoutError:
            process.kill()
            result = TargetResult(target.name, error=f"no progress for {WORKER_SILENCE_S / 60:g} minutes after "
                                  f"{last}; worker killed")
        except ChildDied as err:
            result = TargetResult(target.name, error=f"{err} during {last}")
        finally:
            parent.close()
        process.join(timeout=30)
        if result.error:
            self.progress(f"{target.name}: FAILED ({result.error})")
        return result

    def _serving_default(self, measured: list[TargetResult], artifact) -> ServingRecord | None:
        """The best sweep point of the first variant becomes the artifact's serving default (serving.json)."""
        variant = next((r for r in measured if r.name != PYTORCH and r.sweep and not r.error), None)
        if variant is None or artifact is None:
            return None
        best = max(variant.sweep, key=lambda p: p.sorted_per_s)
        default = ServingRecord(variant.name, best.sessions, best.threads, best.batch_size, best.pad_multiple,
                                best.sorted_per_s, variant.sweep)
        verify(artifact.path)  # never re-seal over a file altered since it was written (best/ included)
        written = []
        best_dir = artifact.path / "best"
        if (best_dir / MANIFEST_NAME).is_file() and variant.name in read_manifest(best_dir).variants:
            write_serving_default(best_dir, default, check=False)  # `kiln serve kiln-out/best` reads it there
            written.append(best_dir / SERVING_FILE)
        write_serving_default(artifact.path, default, check=False)  # last: its seal covers best/'s new files
        written.insert(0, artifact.path / SERVING_FILE)
        self.progress(f"serving default for {variant.name}: {best.sessions} session(s) x {best.threads} "
                      f"thread(s), batches of {best.batch_size} padded to a multiple of {best.pad_multiple} "
                      f"({best.sorted_per_s:.1f} seq/s), written to "
                      f"{', '.join(map(str, written))}")
        return default


@dataclass(frozen=True)
class TimingPlan:
    """How kiln bench times a task of one scheduling kind."""

    settings: Callable[[BenchJob, Any, int, int], BenchSettings]  # (job, encoder, cores, threads) -> settings
    # Time every variant built by default, not only best/: the published decoder comparison is fp32 against int8,
    # and int8 often misses the gate on a small model, so each is timed with its gate status beside it.
    every_variant: bool = False


# How a task's requests are scheduled (TaskSpec.scheduling) -> how kiln bench times it.
PLANS: dict[Scheduling, TimingPlan] = {Scheduling.BATCH: TimingPlan(BenchJob._settings),
                                       Scheduling.DECODE: TimingPlan(BenchJob._generation_settings, True)}

def write_serving_default(directory: Path, default: ServingRecord, *, check: bool = True) -> None:
    """Write serving.json into an artifact and re-seal its manifest so checksums stay valid."""
    if check:
        verify(directory)  # never re-seal over a file that was altered since the artifact was written
    (directory / SERVING_FILE).with_suffix(".tmp").write_text(json.dumps(to_jsonable(default), indent=2) + "\n")
    (directory / SERVING_FILE).with_suffix(".tmp").replace(directory / SERVING_FILE)
    recorded = ServingDefault(default.variant, default.sessions, default.threads, default.batch_size,
                              default.pad_multiple)
    seal(directory, read_manifest(directory).with_build(serving_default=recorded))


def _source_encoder(config: BenchConfig):
    from kiln.source.loading import load_source
    from kiln.source.reference import source_encoder

    return source_encoder(load_source(config.target, config.task))
