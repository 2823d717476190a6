"""kiln optimize: build every variant, validate each against the original, keep the fastest that passes."""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.choices import TaskName
from kiln.cpu import cpu_info, int8_scheme
from kiln.engines import EngineOptions, create_engine
from kiln.errors import KilnError, UsageError
from kiln.exporting import write_tokenizer
from kiln.manifest import Manifest, library_versions, seal
from kiln.optimize import datasets
from kiln.optimize.context import BuildContext, BuiltVariant
from kiln.optimize.onnx_passes import CALIBRATION_METHODS
from kiln.optimize.outcome import Outcome, RunSummary, write_summaries
from kiln.optimize.sensitivity import exclusion_search, rank_layers
from kiln.optimize.timing import time_predictor
from kiln.optimize.variants import VARIANTS, VariantSpec, default_variants, remove_variant_files
from kiln.reference import reference_predictor, vanilla_attention
from kiln.report.data import optimize_section
from kiln.report.html import write_report
from kiln.runtime import Predictor
from kiln.source import load_source
from kiln.staging import staged_directory
from kiln.validation.agreement import AgreementInputs, measure_agreement
from kiln.validation.gate import judge, tolerance_for
from kiln.validation.taskmetric import PRIMARY, evaluate

Progress = Callable[[str], None]
TIE = 0.02  # variants within 2% of the fastest count as tied; the smaller file wins
BEST_DIR = "best"
TARGETS = ("cpu", "cuda")


class NothingPassed(KilnError):
    """Every variant was rejected, skipped or failed."""

    exit_code = 4


@dataclass(frozen=True)
class OptimizeConfig:
    model: str | None
    task: TaskName
    output: Path
    tolerance: float | None = None
    eval_file: Path | None = None
    calibration_file: Path | None = None
    calibration_method: str = "minmax"
    target: str = "cpu"
    variants: tuple[str, ...] | None = None
    threads: int | None = None
    batch_size: int = 32
    allow_pickle: bool = False
    overwrite: bool = False
    sensitivity: bool = True

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise UsageError(f"--target must be one of: {', '.join(TARGETS)} (got {self.target!r})")
        if self.calibration_method not in CALIBRATION_METHODS:
            raise UsageError(f"--calibration-method must be one of: {', '.join(CALIBRATION_METHODS)} "
                             f"(got {self.calibration_method!r})")
        unknown = [v for v in self.variants or () if v not in VARIANTS]
        if unknown:
            raise UsageError(f"--variants must be from: {', '.join(VARIANTS)} (got {', '.join(unknown)})")
        tolerance_for(self.task, self.tolerance)

    def variant_names(self) -> list[str]:
        return list(self.variants) if self.variants else default_variants(self.target)


class OptimizeJob:
    def __init__(self, config: OptimizeConfig, progress: Progress = lambda _: None) -> None:
        self.config = config
        self.progress = progress
        self.cpu = cpu_info()
        self.threads = config.threads or self.cpu.usable_cores
        self.device = _device_for(config.target, progress)

    def run(self) -> RunSummary:
        cfg = self.config
        self.progress(f"loading {cfg.model or 'the bundled default model'} for {cfg.task.value}")
        self.source = load_source(cfg.model, cfg.task, allow_pickle=cfg.allow_pickle)
        self.reference = reference_predictor(self.source, batch_size=cfg.batch_size)
        encoder = self.reference.encoder
        self.tolerance = tolerance_for(cfg.task, cfg.tolerance)
        self.eval_set = datasets.eval_set(cfg.task, cfg.eval_file)
        self.progress("running the PyTorch fp32 reference on the agreement set")
        self.agreement_data = AgreementInputs.build(self.reference, datasets.agreement_inputs(cfg.task, encoder))
        self.reference_metric = evaluate(self.reference, self.eval_set) if self.eval_set else None
        calibration = datasets.calibration_inputs(cfg.task, encoder, cfg.calibration_file)
        user_texts = (datasets.read_texts(cfg.calibration_file, cfg.task) if cfg.calibration_file else None) \
            or datasets.eval_texts(self.eval_set)
        timing_inputs = datasets.timing_inputs(cfg.task, encoder, user_texts)
        self.timing_encodings = self.reference.prepare(timing_inputs).encodings

        with staged_directory(cfg.output, overwrite=cfg.overwrite) as stage, \
                tempfile.TemporaryDirectory(prefix="kiln-scratch-") as scratch:
            tokenizer = write_tokenizer(self.source, stage)
            self.ctx = BuildContext(self.source, stage, encoder, calibration, self.cpu, int8_scheme(self.cpu),
                                    cfg.target, cfg.calibration_method, scratch=Path(scratch))
            outcomes = [self._variant(VARIANTS[name]) for name in cfg.variant_names()]
            self.progress(f"timing the PyTorch fp32 reference on {len(self.timing_encodings)} sequences")
            with vanilla_attention(self.source.model) as attention:
                reference_timing = time_predictor(self._timed(self.reference), self.timing_encodings)
            for outcome in outcomes:
                if outcome.status == "accepted":
                    self.progress(f"timing {outcome.name}")
                    outcome.timing = time_predictor(self._predictor(outcome.record), self.timing_encodings).to_dict()
            best = choose(outcomes)
            self._prune(outcomes)
            summary = RunSummary(
                model=self.source.name, task=cfg.task.value, tolerance=self.tolerance,
                primary_metric=PRIMARY[cfg.task] if self.eval_set else None,
                reference_metric=self.reference_metric, reference_timing=reference_timing.to_dict(),
                outcomes=outcomes, best=best.name if best else None, command=shlex.join(sys.argv),
                baseline_attention=attention,
                environment={"cpu": self.cpu.to_dict(), "threads": self.threads, "versions": library_versions()},
            )
            write_summaries(stage, summary)
            manifest = Manifest(
                source=self.source.describe(), task=self.source.task_config.to_dict(), tokenizer=tokenizer,
                variants={o.name: {**o.record, **_validation(o)} for o in outcomes if o.record},
                extra={"best": summary.best, "skipped": {o.name: o.reason for o in outcomes if not o.record},
                       "tolerance": self.tolerance, "cpu": self.cpu.to_dict(),
                       "reference_timing": {**summary.reference_timing, "attention": attention},
                       "eval": self.eval_set.source if self.eval_set else None,
                       "reference_metric": self.reference_metric},
            )
            if best is None:
                raise NothingPassed(_nothing_passed(outcomes))
            write_best(stage, manifest, best.name)
            write_report(stage, {"model": summary.model, "task": summary.task, "command": summary.command,
                                 "created": manifest.created, "environment": summary.environment,
                                 "optimize": optimize_section(manifest)})
            seal(stage, manifest)
        return summary

    def _timed(self, predictor: Predictor) -> Predictor:
        return Predictor(predictor.config, predictor.encoder, predictor.engine, batch_size=self.config.batch_size)

    def _predictor(self, record: dict[str, Any]) -> Predictor:
        device = self.device if record["engine"] != "openvino" else "cpu"
        engine = create_engine(record["engine"], self.ctx.stage / record["path"],
                               EngineOptions.for_variant(record, self.threads, device))
        return Predictor(self.source.task_config, self.reference.encoder, engine, batch_size=self.config.batch_size)

    def _validate(self, built: BuiltVariant) -> tuple[dict, dict | None, Any]:
        predictor = self._predictor(built.record())
        agreement = measure_agreement(self.config.task, self.agreement_data, predictor)
        metric = evaluate(predictor, self.eval_set) if self.eval_set else None
        primary = PRIMARY[self.config.task]
        verdict = judge(self.config.task, agreement, self.tolerance,
                        metric[primary] if metric else None,
                        self.reference_metric[primary] if self.reference_metric else None)
        return agreement.to_dict(), metric, verdict

    def _variant(self, spec: VariantSpec) -> Outcome:
        if reason := spec.why_not(self.ctx):
            self.progress(f"{spec.name}: skipped ({reason})")
            return Outcome(spec.name, "skipped", reason)
        self.progress(f"building {spec.name}")
        start = time.perf_counter()
        try:
            built = spec.build(self.ctx, ())
            agreement, metric, verdict = self._validate(built)
        except KilnError:
            raise
        except Exception as err:  # a pass that breaks is reported loudly (manifest, report, exit code)
            remove_variant_files(self.ctx, spec.name)
            self.progress(f"{spec.name}: FAILED ({type(err).__name__}: {err})")
            return Outcome(spec.name, "failed", f"{type(err).__name__}: {err}")
        sensitivity, params = None, {}
        if not verdict.accepted and spec.alternatives and self.config.sensitivity:
            self.progress(f"{spec.name}: {verdict.reason}; trying its alternative parameters")
            built, agreement, metric, verdict, params = self._alternatives(spec, built, agreement, metric, verdict)
        if not verdict.accepted and spec.sensitivity is not None and self.config.sensitivity:
            self.progress(f"{spec.name}: {verdict.reason}; ranking layers by int8 sensitivity")
            built, agreement, metric, verdict, sensitivity = self._exclude(spec, built, agreement, metric, verdict,
                                                                           params)
        outcome = Outcome(spec.name, "accepted" if verdict.accepted else "rejected", verdict.reason,
                          record=built.record(), agreement=agreement, metric=metric,
                          size_bytes=sum((self.ctx.stage / f).stat().st_size for f in built.files),
                          sensitivity=sensitivity, build_seconds=time.perf_counter() - start)
        self.progress(f"{spec.name}: {outcome.status} ({verdict.reason})")
        return outcome

    def _alternatives(self, spec: VariantSpec, built: BuiltVariant, agreement, metric, verdict):
        """Try the variant's alternative parameters in order; keep the first that passes, else the best."""
        best = (built, agreement, metric, verdict, {})
        for params in spec.alternatives:
            candidate = spec.build(self.ctx, (), **params)
            a, m, v = self._validate(candidate)
            self.progress(f"{spec.name} with {params}: {v.reason}")
            if v.accepted:
                return candidate, a, m, v, params
            if a["value"] > best[1]["value"]:
                best = (candidate, a, m, v, params)
        built, agreement, metric, verdict, params = best
        spec.build(self.ctx, (), **params)  # leave the best attempt's files on disk
        return built, agreement, metric, verdict, params

    def _exclude(self, spec: VariantSpec, built: BuiltVariant, agreement, metric, verdict, params: dict):
        """Rebuild with the most int8-sensitive layers kept in fp32 until the gate passes."""
        ranking = rank_layers(spec.sensitivity(self.ctx), self.ctx.calibration_batches()[:16],
                              static=spec.static_ranges)
        timing_set = self.timing_encodings[:64]
        full_seconds = time_predictor(self._predictor(built.record()), timing_set, rounds=1).seconds
        attempts: dict[int, tuple] = {}

        def attempt(excluded: list[str]) -> tuple[float, bool]:
            candidate = spec.build(self.ctx, excluded, **params)
            a, m, v = self._validate(candidate)
            attempts[len(excluded)] = (candidate, a, m, v)
            self.progress(f"{spec.name}: {len(excluded)} layer(s) kept in fp32 -> {v.reason}")
            return a["value"], v.accepted

        search = exclusion_search(ranking, attempt)
        record: dict[str, Any] = {"ranking": [[name, error] for name, error in ranking[:10]],
                                  "rounds": [r.to_dict() for r in search.rounds],
                                  "excluded": search.excluded, "accepted": search.accepted}
        if not search.accepted:
            spec.build(self.ctx, (), **params)  # leave the fully quantized files the rejection describes
            record["result"] = "no exclusion set passed the gate"
            return built, agreement, metric, verdict, record
        # The search stops at the first accepted attempt, so its files are the ones on disk.
        built, agreement, metric, verdict = attempts[len(search.excluded)]
        seconds = time_predictor(self._predictor(built.record()), timing_set, rounds=1).seconds
        record["speed_cost"] = seconds / full_seconds  # > 1: slower than the fully quantized model
        return built, agreement, metric, verdict, record

    def _prune(self, outcomes: list[Outcome]) -> None:
        """Remove intermediates no recorded variant uses (e.g. a fused graph built only to quantize)."""
        used = {Path(f).parts[0] for o in outcomes if o.record for f in o.record["files"]}
        for child in self.ctx.stage.iterdir():
            if child.is_dir() and child.name not in used | {"tokenizer"}:
                shutil.rmtree(child)


def _device_for(target: str, progress: Progress) -> str:
    """Validate and time on the GPU for --target cuda when ONNX Runtime can use one; say so when not."""
    if target != "cuda":
        return "cpu"
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return "cuda"
    progress("--target cuda: no CUDA execution provider here; variants are validated and timed on the CPU")
    return "cpu"


def choose(outcomes: list[Outcome]) -> Outcome | None:
    """Fastest accepted variant; within TIE of the fastest, the smallest file wins."""
    timed = [o for o in outcomes if o.status == "accepted" and o.timing]
    if not timed:
        return None
    fastest = min(o.timing["ms_per_sequence"] for o in timed)
    tied = [o for o in timed if o.timing["ms_per_sequence"] <= fastest * (1 + TIE)]
    return min(tied, key=lambda o: (o.size_bytes, o.timing["ms_per_sequence"]))


def _validation(outcome: Outcome) -> dict[str, Any]:
    return {"status": outcome.status, "reason": outcome.reason, "agreement": outcome.agreement,
            "task_metric": outcome.metric, "timing": outcome.timing, "size_bytes": outcome.size_bytes,
            "sensitivity": outcome.sensitivity}


def _nothing_passed(outcomes: list[Outcome]) -> str:
    lines = "; ".join(f"{o.name} {o.status}: {o.reason}" for o in outcomes)
    return f"no variant passed the gate ({lines}). Raise --tolerance or check the model"


def write_best(stage: Path, manifest: Manifest, name: str) -> None:
    """A self-contained artifact of the chosen variant in ``best/`` (servable on its own)."""
    best = stage / BEST_DIR
    best.mkdir()
    record = manifest.variants[name]
    for rel in [*record["files"], *(p.relative_to(stage).as_posix() for p in (stage / "tokenizer").rglob("*")
                                    if p.is_file())]:
        (best / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(stage / rel, best / rel)
    seal(best, Manifest(source=manifest.source, task=manifest.task, tokenizer=manifest.tokenizer,
                        variants={name: record}, extra={"best": name}))
