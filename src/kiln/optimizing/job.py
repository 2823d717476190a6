"""kiln optimize: build every variant, validate each against the original, keep the fastest that passes."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tokenizers import Encoding

from kiln.artifact.cpu_pick import store_agreement_inputs, unchecked_classes
from kiln.artifact.directory import copy_variant
from kiln.artifact.emulation import emulate
from kiln.artifact.manifest import Manifest, seal
from kiln.artifact.staging import staged_directory
from kiln.choices import Batching, CalibrationMethod, Scheduling, Target, parse_choice
from kiln.engines import PROBED_ENGINES, EngineOptions, create_engine
from kiln.engines.probe import EngineProbe
from kiln.errors import KilnError, NativeCrashError, UsageError, stop_if_no_room
from kiln.exporting.job import write_tokenizer
from kiln.optimizing.context import BuildContext, BuiltVariant, DependencyFailed
from kiln.optimizing.outcome import Outcome, RunSummary, write_stored_vectors, write_summaries
from kiln.optimizing.sensitivity import RankedLayer, exclusion_search, paying_limit, share_limit
from kiln.optimizing.variants import VARIANTS, VariantSpec, default_variants, remove_variant_files
from kiln.records.artifact import (
    BuildRecord,
    ReferenceTiming,
    Sensitivity,
    Status,
    StoredVectors,
    TokenizerRecord,
    VariantRecord,
)
from kiln.records.batching import BatchedAgreement
from kiln.records.bench import BenchResults, OptimizeSection
from kiln.records.figures import Agreement, AgreementInputs, EvalSet
from kiln.records.timing import Timing
from kiln.report.html import write_report
from kiln.runtime.precision import CALIBRATION_FILE, parse_precision
from kiln.runtime.predictor import Predictor
from kiln.runtime.timing import time_predictor
from kiln.source.loading import SourceModel, load_source
from kiln.source.reference import reference_predictor, timing_predictor, vanilla_attention
from kiln.system.cpu import CPU_CLASS_NAMES, cpu_info, int8_scheme
from kiln.system.disk import low_space_note
from kiln.system.invocation import invocation
from kiln.system.memory import live_objects_set_aside, release_freed
from kiln.system.versions import library_versions
from kiln.tasks import TASKS, task_handler, task_spec
from kiln.validation import datasets
from kiln.validation.agreement import agreement_inputs, measure_agreement
from kiln.validation.batching import measure_batchings
from kiln.validation.gate import Verdict, judge, judge_drift, tolerance_for

Progress = Callable[[str], None]
T = TypeVar("T")
TIE = 0.02  # variants within 2% of the fastest count as tied; the smaller file wins
BEST_DIR = "best"


OUTPUT_CALIBRATION_TEXTS = 512  # built-in texts the output precision's int8 ranges come from

# How a verdict names the batching it was judged on, when that is not the plain sorted one.
WORST_WORDS = {Batching.MIXED: "mixed batches", Batching.ALONE: "run alone",
               Batching.SESSIONS: "over one-thread sessions"}


class NothingPassed(KilnError):
    """Every variant was rejected, skipped or failed."""

    exit_code = 4

    def __init__(self, message: str, summary: RunSummary | None = None) -> None:
        super().__init__(message)
        self.summary = summary  # what each variant measured, for the frontier of kiln optimize's students


@dataclass(frozen=True)
class OptimizeConfig:
    model: str | None
    task: str
    output: Path
    tolerance: float | None = None
    eval_file: Path | None = None
    calibration_file: Path | None = None
    calibration_method: CalibrationMethod = CalibrationMethod.MINMAX
    target: Target = Target.CPU
    variants: tuple[str, ...] | None = None
    threads: int | None = None
    batch_size: int = 32
    allow_pickle: bool = False
    adapter: str | None = None  # the task LoRA adapter to merge (kiln.source.adapters); None: none
    overwrite: bool = False
    sensitivity: bool = True
    # The model every variant is judged and timed against (a student's teacher); None: the model itself.
    reference: str | None = None
    # Time rejected variants too: a student's frontier shows what each variant would buy (kiln/optimizing/students).
    time_rejected: bool = False
    matryoshka_dims: tuple[int, ...] = ()  # embedding sizes validated and recorded besides the full one
    # Output precisions whose retrieval cost is measured (with every Matryoshka size) and gated
    # (kiln.validation.stored_vectors); kiln serve refuses the rejected ones.
    precisions: tuple[str, ...] = ()
    retrieval_tolerance: float = 0.03  # recall@10 of the full-size float32 neighbours >= 1 - this
    # CPU classes the artifact will run on (--for); the ones other than this CPU's are recorded as unchecked
    # (kiln.artifact.cpu_pick re-validates on them at load).
    for_classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Library callers may pass plain strings; the checked Enum replaces them (frozen: object.__setattr__).
        object.__setattr__(self, "target", parse_choice(Target, self.target, "target"))
        object.__setattr__(self, "calibration_method",
                           parse_choice(CalibrationMethod, self.calibration_method, "calibration_method"))
        allowed = task_spec(self.task).export.variants or tuple(v for v, s in VARIANTS.items() if not s.decoders_only)
        for name in self.variants or ():
            if name not in allowed and name in VARIANTS and VARIANTS[name].decoders_only:
                raise UsageError(f"variants: {name} is refused for --task {self.task}: {VARIANTS[name].decoders_only}")
        unknown = [v for v in self.variants or () if v not in allowed]
        if unknown:
            raise UsageError(f"variants must be from: {', '.join(allowed)} for --task {self.task} "
                             f"(got {', '.join(unknown)})")
        tolerance_for(self.task, self.tolerance)
        if self.matryoshka_dims and not task_spec(self.task).embeds:
            raise UsageError(f"matryoshka_dims applies to embedding tasks; this run is --task {self.task}")
        object.__setattr__(self, "precisions", tuple(parse_precision(p, "precisions") for p in self.precisions))
        if self.precisions and not (task_spec(self.task).embeds or task_spec(self.task).multi_vectors):
            kinds = ", ".join(name for name, spec in TASKS.items() if spec.embeds or spec.multi_vectors)
            raise UsageError(f"precisions applies to tasks whose results are stored vectors ({kinds}); this run is "
                             f"--task {self.task}")
        if unknown_classes := [c for c in self.for_classes if c not in CPU_CLASS_NAMES]:
            raise UsageError(f"for_classes takes CPU classes of: {', '.join(CPU_CLASS_NAMES)} "
                             f"(got {', '.join(unknown_classes)})")
        if not 0 < self.retrieval_tolerance < 1:
            raise UsageError(f"retrieval_tolerance must be between 0 and 1 (got {self.retrieval_tolerance:g})")

    def variant_names(self) -> list[str]:
        return list(self.variants) if self.variants else default_variants(self.target, self.task)


@dataclass(frozen=True)
class Checked:
    """One build of a variant and how it fared against the original."""

    built: BuiltVariant
    agreement: Agreement  # under the worst batching: what the gate judged
    metric: dict[str, float] | None
    verdict: Verdict
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    batched: BatchedAgreement | None = None


@dataclass(frozen=True)
class Workload:
    """What every variant is measured on: the reference's outputs, labelled data, calibration and timing inputs."""

    agreement: AgreementInputs
    eval_set: EvalSet | None
    reference_metric: dict[str, float] | None
    calibration: list[Any]
    calibration_source: str  # where the calibration inputs came from, shown in the summary and the report
    timing: tuple[Encoding, ...]


@dataclass(frozen=True)
class SearchBound:
    """What an int8 search may keep in fp32, and the words for it."""

    limit: int | None  # most layers kept in fp32; None: exclusion_search's default share
    ranking: list[RankedLayer]  # empty when nothing could pay (not ranked)
    rejection: str = ""  # what a rejection adds when the bound stopped the search
    figures: str = ""  # the timings it came from
    search: str = ""  # how far the search goes, when it runs

    @property
    def said(self) -> str:
        """The bound as the log and the sensitivity record say it ("" where no timings bounded it)."""
        if not self.figures:
            return ""
        return f"{self.search or self.rejection} ({self.figures})"


class OptimizeJob:
    def __init__(self, config: OptimizeConfig, progress: Progress = lambda _: None) -> None:
        self.config = config
        self.progress = progress
        self.cpu = cpu_info()
        self.threads = config.threads or self.cpu.usable_cores
        self.device = _device_for(config.target, progress)
        self.spec = task_spec(config.task)
        self.tolerance = tolerance_for(config.task, config.tolerance)
        self.probe = EngineProbe()  # loads a variant's engine in a child first, where a native crash is survivable
        # Why no precision search can help: against --reference, the model itself (PyTorch fp32) already fails
        # the gate, and keeping layers in fp32 cannot recover a student's own loss.
        self.own_loss: str | None = None

    def run(self) -> RunSummary:
        try:
            return self._run()
        finally:
            self.probe.close()

    def _run(self) -> RunSummary:
        cfg = self.config
        # The user's files first: a bad line in --eval or --calibration is one error before the model loads, not
        # after (loading the tiny BERT cost 9 s of imports in a fresh process; a real model's weights, minutes).
        eval_set = datasets.eval_set(cfg.task, cfg.eval_file)
        user = datasets.read_inputs(cfg.calibration_file, cfg.task) if cfg.calibration_file else None
        self.source, self.reference = self._load()
        # Described while the weights are there (they may be freed before the manifest is written).
        self.described = (self.source.describe(), self.original.describe())
        self.work = self._workload(eval_set, user)
        if cfg.reference is not None:
            self._judge_the_model_itself()
        # The model, its reference run and every import are loaded by now: set aside from the collections between
        # stages (the weights are freed by moving them to the meta device, not by a collection).
        with staged_directory(cfg.output, overwrite=cfg.overwrite) as stage, \
                tempfile.TemporaryDirectory(prefix="kiln-scratch-") as scratch, live_objects_set_aside():
            tokenizer = write_tokenizer(self.source, stage)
            self.ctx = BuildContext(self.source, stage, self.reference.encoder, self.work.calibration, self.cpu,
                                    int8_scheme(self.cpu), cfg.target, cfg.calibration_method, scratch=Path(scratch),
                                    device=self.device)
            # The original is timed first, so its PyTorch weights can go once no variant left to build reads them
            # (GPT-2 small's are 0.5 GB of a decoder run's peak). Each variant is timed as soon as it is judged (an
            # int8 search bounds itself by the times of those before it); each stage's engines are dropped when it
            # ends, their memory handed back before the next one loads.
            reference_timing, attention = _released(self._time_reference())
            self.outcomes: list[Outcome] = []
            names = judging_order(cfg.variant_names())
            for k, name in enumerate(names):
                self.remaining = names[k:]  # this variant and those after it (_build frees the model by them)
                self.outcomes.append(_released(self._time(_released(self._variant(VARIANTS[name])))))
                self._free_the_model_unless(names[k + 1 :])
            order = cfg.variant_names()  # the report lists them as asked
            outcomes = sorted(self.outcomes, key=lambda o: order.index(o.name))
            best = choose(outcomes)
            kept = self._reference_variant()
            self._prune(outcomes, kept)
            summary = self._summary(outcomes, best, reference_timing, attention)
            write_summaries(stage, summary)
            if best is None:  # before the output calibration: minutes of the fp32 reference at a real model's size
                raise NothingPassed(_nothing_passed(outcomes), summary)
            calibration = self._output_calibration(kept)
            stored = self._stored_vectors(best, calibration)
            manifest = self._manifest(summary, tokenizer).with_build(
                reference_variant=kept, output_calibration=calibration, stored_vectors=stored,
                retrieval_tolerance=cfg.retrieval_tolerance if stored else None,
                agreement_inputs=store_agreement_inputs(stage, self.work.agreement.prepared.inputs),
                unchecked_classes=unchecked_classes(cfg.for_classes, self.cpu))
            if stored:
                write_stored_vectors(stage, stored, cfg.retrieval_tolerance)
            manifest = self._emulate(stage, manifest)
            write_best(stage, manifest, best.name)
            write_report(stage, BenchResults(summary.model, summary.task, summary.command, summary.environment,
                                             created=manifest.created, optimize=OptimizeSection.of(manifest)))
            seal(stage, manifest)
        return summary

    # -- the original and what variants are measured on ----------------------------------------------------
    def _load(self) -> tuple[SourceModel, Predictor]:
        """The model to build variants of, and the predictor of the original they are judged against: the model
        itself, or with --reference the model it was made from, so a student's own loss is never hidden."""
        cfg = self.config
        self.progress(f"loading {cfg.model or 'the bundled default model'} for {self.spec.name}")
        source = _with_matryoshka(load_source(cfg.model, cfg.task, allow_pickle=cfg.allow_pickle,
                                              adapter=cfg.adapter), cfg.matryoshka_dims)
        self.original = source
        if cfg.reference is not None:
            self.progress(f"loading the reference {cfg.reference}: every variant is judged and timed against it")
            self.original = _with_matryoshka(load_source(cfg.reference, cfg.task, allow_pickle=cfg.allow_pickle,
                                                         adapter=cfg.adapter), cfg.matryoshka_dims)
            _check_comparable(source, self.original)
        return source, reference_predictor(self.original, batch_size=cfg.batch_size, threads=self.threads)

    def _judge_the_model_itself(self) -> None:
        """The model's own PyTorch fp32 against the reference: the most any of its variants can agree."""
        own = measure_agreement(self.work.agreement, reference_predictor(self.source, batch_size=self.config.batch_size,
                                                                         threads=self.threads))
        verdict = judge(self.config.task, own, self.tolerance, None, None)
        self.progress(f"the model itself (PyTorch fp32) against the reference: {verdict.reason}")
        if not verdict.accepted:
            self.own_loss = f"the model itself (PyTorch fp32) already fails against the reference ({verdict.reason})"

    def _workload(self, eval_set: EvalSet | None, user: list[Any] | None) -> Workload:
        """``eval_set``, ``user``: the labelled data and the user's calibration inputs, read before the model."""
        cfg, encoder = self.config, self.reference.encoder
        self.progress("running the PyTorch fp32 reference on the agreement set")
        def generator() -> Predictor:  # the original as it generates, for a decoder's greedy continuations
            return timing_predictor(self.original, batch_size=cfg.batch_size, threads=self.threads)

        data = agreement_inputs(self.reference, self.spec.validation.agreement_inputs(encoder), generator)
        judge = self.spec.validation
        reference_metric = self._metric(self.reference, eval_set, lambda: judge.agreement(data, data.reference)) \
            if eval_set is not None else None
        calibration = user or self.spec.validation.calibration_inputs(encoder)
        source = f"{cfg.calibration_file} ({len(calibration)} inputs)" if user else datasets.builtin_calibration(
            len(calibration))
        timing = datasets.user_inputs(cfg.task, user, eval_set) or self.spec.validation.timing_inputs(encoder)
        return Workload(data, eval_set, reference_metric, calibration, source,
                        tuple(self.reference.prepare(timing).encodings))

    # -- one variant: build, check, retry; every failure stays inside this boundary ------------------------
    def _variant(self, spec: VariantSpec) -> Outcome:
        chosen_by_user = bool(self.config.variants)
        if reason := spec.why_not(self.ctx) or (not chosen_by_user and spec.not_by_default(self.ctx)):
            self.progress(f"{spec.name}: skipped ({reason})")
            return Outcome(spec.name, Status.SKIPPED, reason)
        self.progress(f"building {spec.name}")
        start = time.perf_counter()
        try:
            checked = self._build_and_check(spec, ())
            sensitivity, timing = None, None
            search = self.config.sensitivity and self.own_loss is None
            if not checked.verdict.accepted and self.own_loss and (spec.alternatives or spec.rank):
                self.progress(f"{spec.name}: {checked.verdict.reason}; no precision search: {self.own_loss}")
            if not checked.verdict.accepted and spec.alternatives and search:
                # Alternative parameters (SmoothQuant's alpha) move accuracy, not speed: a fully int8 variant no
                # faster than the fastest accepted one cannot win with any of them, nor with layers back in fp32.
                # Told before the sweep: the tiny BERT's default optimize spent 13 of its 38 s on four alphas of
                # an openvino-int8-static the timings then left unsearched (`kiln optimize DIR`, AMX Xeon).
                hopeless = self._no_faster(spec, checked)
                if hopeless is not None:
                    checked, sensitivity = hopeless
                    search = False
                else:
                    self.progress(f"{spec.name}: {checked.verdict.reason}; trying its alternative parameters")
                    checked = self._alternatives(spec, checked)
            if not checked.verdict.accepted and spec.rank is not None and search:
                self.progress(f"{spec.name}: {checked.verdict.reason}; ranking layers by quantization sensitivity")
                checked, sensitivity, timing = self._exclude(spec, checked)
        except DependencyFailed as err:  # said once, by the variant that failed; this one names it
            self.progress(f"{spec.name}: skipped ({err.name} failed)")
            remove_variant_files(self.ctx, spec.name)
            return Outcome(spec.name, Status.SKIPPED, f"{err.name} failed, and {spec.name} is built from it")
        except KilnError as err:
            if isinstance(err, UsageError):
                raise  # the user's input is wrong for every variant alike
            return self._failed(spec, err, start)
        except Exception as err:  # a pass (or its retry) that breaks is reported loudly, and the run goes on
            stop_if_no_room(err)
            return self._failed(spec, err, start)
        status = Status.ACCEPTED if checked.verdict.accepted else Status.REJECTED
        outcome = Outcome(spec.name, status, checked.verdict.reason, record=checked.built.record(),
                          agreement=checked.agreement, metric=checked.metric,
                          # cut short before the alone run: no drift was measured (not "batch-invariant")
                          batched=checked.batched if Batching.ALONE in checked.batched.agreements else None,
                          size_bytes=sum((self.ctx.stage / f).stat().st_size for f in checked.built.files),
                          parameters=checked.parameters, sensitivity=sensitivity,
                          build_seconds=time.perf_counter() - start,
                          timing=timing if checked.verdict.accepted else None)
        self.progress(f"{spec.name}: {status.value} ({checked.verdict.reason})")
        return outcome

    def _failed(self, spec: VariantSpec, err: Exception, start: float) -> Outcome:
        reason = f"{type(err).__name__}: {err}{low_space_note(self.ctx.stage)}"  # measured before its files go
        remove_variant_files(self.ctx, spec.name)
        self.ctx.failed(spec.name, reason)
        self.progress(f"{spec.name}: FAILED ({reason})")
        return Outcome(spec.name, Status.FAILED, reason, build_seconds=time.perf_counter() - start)

    def _build_and_check(self, spec: VariantSpec, excluded: list[str] | tuple[str, ...], **params: Any) -> Checked:
        return self._check(self._build(spec, excluded, params), params)

    def _build(self, spec: VariantSpec, excluded: Sequence[str], params: dict[str, Any]) -> BuiltVariant:
        """The variant's files, and the memory its passes freed handed back before its check loads it: OpenVINO's
        conversion of GPT-2 small peaks at 1.3 GB, and left that much in the heap under the check's engine and
        logits (`python benchmarks/optimize_profile.py`). The PyTorch weights go as soon as the build leaves no
        variant from this one on that reads them: the fp32 export's own check and timing no longer carry them."""
        built = spec.build(self.ctx, excluded, **params)
        self._free_the_model_unless(self.remaining)
        return _released(built)

    def _check(self, built: BuiltVariant, params: dict[str, Any], screen: bool = False) -> Checked:
        """The gate's verdict on a built variant. ``screen``: the sorted batching's agreement only (no other
        batching, no drift, no task metric), for search attempts whose chosen set is checked fully later."""
        predictor = self._predictor(built.record())
        # Judged under every batching a server may give its inputs (sorted, mixed, alone, over several one-thread
        # sessions): the worst one counts.
        def hopeless(agreement: Agreement) -> bool:  # a batching under the floors: the worst can only be lower
            return screen or not judge(self.config.task, agreement, self.tolerance).accepted

        # Several sessions side by side is a plan of the batch scheduler only: kiln serve decodes on one session
        # (its DecodeLoop), so a decoder is not judged, nor loaded twice more, for a plan that never serves it.
        sessions = (lambda: self._predictor(built.record(), sessions=2)) \
            if self.spec.scheduling is Scheduling.BATCH else None
        batched = measure_batchings(self.work.agreement, predictor, sessions, hopeless)
        agreement = batched.agreements[batched.worst]
        data = self.work.eval_set
        verdict = gate_verdict(self.config.task, batched, None, None, self.tolerance)
        metric = None
        if verdict.accepted and data is not None and not screen:  # it can only add a reason to reject
            metric = self._metric(predictor, data, lambda: agreement)
            verdict = gate_verdict(self.config.task, batched, metric, self.work.reference_metric, self.tolerance)
        return Checked(built, agreement, metric, verdict, params, batched)

    def _metric(self, predictor: Predictor, data: EvalSet, agreement: Callable[[], Agreement]) -> dict[str, float]:
        """The task metric on ``data``: from the agreement run where it already holds it (a decoder's built-in
        perplexity, of the batching the gate judges), else a pass of its own. ``agreement`` is asked for only on
        the built-in set (the reference's, against itself, is computed for that alone)."""
        carried = self.spec.validation.builtin_metric_of(agreement()) if data.builtin else None
        return carried if carried is not None else self.spec.validation.evaluate(predictor, data)

    def _no_faster(self, spec: VariantSpec, full: Checked) -> tuple[Checked, Sensitivity] | None:
        """The rejection, unsearched, of a fully int8 variant that is no faster than the fastest accepted variant
        (the same words as the search's own bound); None where it may still pay, or nothing was timed yet."""
        timing = _released(time_predictor(self._predictor(full.built.record(), timed=True), self.work.timing,
                                          rounds=1))
        slower = self._slower_than_best(timing)
        if slower is None:
            return None
        rejection, said = slower
        self.progress(f"{spec.name}: {said}")
        verdict = dataclasses.replace(full.verdict, reason=f"{full.verdict.reason}; {rejection}")
        return dataclasses.replace(full, verdict=verdict), Sensitivity((), (), (), False, bound=said)

    def _slower_than_best(self, full: Timing) -> tuple[str, str] | None:
        """(rejection, figures) where the fully int8 variant timed ``full`` is no faster than the fastest accepted
        variant: then nothing its search or parameters change can make it the choice."""
        timed = accepted_and_timed(self.outcomes)
        if not timed:
            return None
        best = min(timed, key=lambda o: o.timing.ms_per_sequence)
        if full.ms_per_sequence < best.timing.ms_per_sequence:
            return None
        return (f"not searched: fully quantized, it is no faster than {best.name}",
                f"fully quantized {full.ms_per_sequence:.1f} ms a text, fastest accepted ({best.name}) "
                f"{best.timing.ms_per_sequence:.1f}")

    def _alternatives(self, spec: VariantSpec, default: Checked) -> Checked:
        """Try the variant's alternative parameters in order; keep the first that passes, else the best."""
        best = default
        for params in spec.alternatives:
            candidate = self._build_and_check(spec, (), **params)
            self.progress(f"{spec.name} with {params}: {candidate.verdict.reason}")
            if candidate.verdict.accepted:
                return candidate
            if candidate.agreement.value > best.agreement.value:
                best = candidate
        spec.build(self.ctx, (), **best.parameters)  # leave the best attempt's files on disk
        return best

    def _exclude(self, spec: VariantSpec, full: Checked) -> tuple[Checked, Sensitivity, Timing | None]:
        """Rebuild with the most int8-sensitive layers kept in fp32 until the gate passes, keeping no more than can
        pay (``_search_limit``). The chosen set's timing comes back with it: the run's own timing of the variant."""
        # Timed now, while the files on disk are the fully quantized ones the search starts from.
        # Both hand back what they freed before the attempts build: GPT-2 small's onnx-int8-dynamic built its first
        # attempt on 2.2 GB left resident by the ranking, and peaked at 3.37 GB (`benchmarks/optimize_profile.py`).
        full_timing = _released(time_predictor(self._predictor(full.built.record(), timed=True), self.work.timing,
                                               rounds=1))
        bound = self._search_limit(spec, lambda: _released(spec.rank(self.ctx, self.ctx.calibration_batches()[:16])),
                                   full_timing)
        ranking, limit = bound.ranking, bound.limit
        if bound.said:
            self.progress(f"{spec.name}: {bound.said}")
        # Kept aside when attempts will overwrite them, and put back if the search finds nothing (re-quantizing
        # them cost GPT-2 small 11 s).
        stash = self._stash(full.built) if limit != 0 else None
        attempts: dict[int, Checked] = {}  # by count; the last one added is the one whose files are on disk

        def attempt(excluded: list[str]) -> tuple[float, bool]:
            # Screened on the sorted batching alone: a passing attempt's full check cost ~50 s against ~14 s on
            # GPT-2 small, and bisection makes several. The set the search settles on is checked fully below.
            candidate = self._check(self._build(spec, excluded, full.parameters), full.parameters, screen=True)
            attempts[len(excluded)] = candidate
            self.progress(f"{spec.name}: {len(excluded)} layer(s) kept in fp32 -> {candidate.verdict.reason} "
                          f"(sorted batches)")
            return candidate.agreement.value, candidate.verdict.accepted

        names = [layer.name for layer in ranking]
        # Where the primary figure must reach: the search aims its guesses at it (exclusion_search).
        floor = next((f.floor for f in self.spec.validation.floors(full.agreement, self.tolerance)
                      if f.figure == full.agreement.primary), None)
        search = exclusion_search(names, attempt, limit=limit, start=full.agreement.value, floor=floor)
        top = tuple((layer.name, layer.error) for layer in ranking[:10])
        confirmed = self._confirm(spec, full, names, attempts, len(search.excluded)) if search.accepted else None
        if confirmed is None:  # leave the fully quantized files the rejection describes
            if stash is not None:
                shutil.rmtree(self.ctx.stage / full.built.name)
                shutil.move(stash, self.ctx.stage / full.built.name)
            elif search.rounds:  # an attempt overwrote them and nothing was set aside
                spec.build(self.ctx, (), **full.parameters)
            if bound.rejection:  # the bound stopped it: nothing searched, or its first attempt (the most) failed
                full = dataclasses.replace(full, verdict=dataclasses.replace(
                    full.verdict, reason=f"{full.verdict.reason}; {bound.rejection}"))
            return full, Sensitivity(top, search.rounds, (), False, bound=bound.said), None
        excluded, chosen = confirmed
        if stash is not None:
            shutil.rmtree(stash)
        timing = time_predictor(self._predictor(chosen.built.record(), timed=True), self.work.timing)
        return chosen, Sensitivity(top, search.rounds, excluded, True, speed_cost=timing.seconds / full_timing.seconds,
                                   bound=bound.said), timing

    def _stash(self, built: BuiltVariant) -> Path | None:
        """A copy of ``built``'s own directory in the scratch space; None where its files are not all in it (a
        variant sharing another's files), or there is no scratch space."""
        own = self.ctx.stage / built.name
        if self.ctx.scratch is None or not all(Path(f).parts[0] == built.name for f in built.files):
            return None
        stash = self.ctx.scratch / f"stash-{built.name}"
        shutil.rmtree(stash, ignore_errors=True)
        shutil.copytree(own, stash)
        return stash

    def _search_limit(self, spec: VariantSpec, rank: Callable[[], list[RankedLayer]], full: Timing) -> SearchBound:
        """How many layers the search may keep in fp32 (kiln.optimizing.sensitivity.paying_limit), from this run's
        timings of the variant fully int8, of the float graph it quantizes and of the fastest accepted variant;
        exclusion_search's default share where the float graph's time is not known (not built, or failed)."""
        timed = accepted_and_timed(self.outcomes)
        source = spec.quantizes(self.ctx) if spec.quantizes else None
        float_timing = next((o.timing for o in timed if o.name == source), None)
        if float_timing is None:
            return SearchBound(None, rank())
        best = min(timed, key=lambda o: o.timing.ms_per_sequence)
        said = (f"fully quantized {full.ms_per_sequence:.1f} ms a text, {source} {float_timing.ms_per_sequence:.1f}, "
                f"fastest accepted ({best.name}) {best.timing.ms_per_sequence:.1f}")
        if slower := self._slower_than_best(full):  # no ranking either: nothing can pay
            return SearchBound(0, [], slower[0], said)
        ranking = rank()
        paying = paying_limit(ranking, quantized_ms=full.ms_per_sequence, float_ms=float_timing.ms_per_sequence,
                              best_ms=best.timing.ms_per_sequence)
        if paying == 0:
            return SearchBound(0, ranking, f"not searched: its most sensitive layer in fp32 would keep less than "
                                           f"half of int8's gain over {best.name}", said)
        limit = min(paying, share_limit(len(ranking)))
        why = (f"more would keep less than half of int8's gain over {best.name}" if limit == paying else
               f"half the layers (by the timings, {paying} would still keep half of int8's gain over {best.name})")
        return SearchBound(limit, ranking,
                           f"the most it may keep in fp32, {limit} of {len(ranking)} layers, did not pass; {why}",
                           f"{said}; time predicted by the share of weights kept",
                           f"searching up to {limit} of {len(ranking)} layers in fp32: {why}")

    def _confirm(self, spec: VariantSpec, full: Checked, names: list[str],
                 attempts: dict[int, Checked], settled: int) -> tuple[tuple[str, ...], Checked] | None:
        """The fewest layers kept in fp32 that pass every batching, and their check: the set the screened search
        settled on, else the next larger set that passed the screen; None when none does. A set is rebuilt unless
        its files are the last written (the last attempt's)."""
        last = next(reversed(attempts))
        for count in sorted(n for n, c in attempts.items() if c.verdict.accepted and n >= settled):
            excluded = tuple(names[:count])
            built = attempts[count].built if count == last else self._build(spec, excluded, full.parameters)
            last = count
            checked = self._check(built, full.parameters)
            self.progress(f"{spec.name}: {count} layer(s) kept in fp32 -> {checked.verdict.reason} (every batching)")
            if checked.verdict.accepted:
                return excluded, checked
        return None

    # -- timing, choice, records ---------------------------------------------------------------------------
    def _emulate(self, stage: Path, manifest: Manifest) -> Manifest:
        """--for classes this CPU can cap OpenVINO to: its variants judged under each cap (kiln.artifact.emulation,
        which seals the staged artifact for the processes that open it); the verdicts then join the build record
        (and best/'s, written after)."""
        cfg = self.config
        emulated = emulate(stage, manifest, cfg.for_classes, self.cpu, self.progress)
        if not emulated:  # no class to cap to, or no OpenVINO variant: nothing else here honours the cap
            return manifest
        return manifest.with_build(emulated_classes=emulated,
                                   unchecked_classes=unchecked_classes(cfg.for_classes, self.cpu, emulated))

    def _predictor(self, record: VariantRecord, sessions: int = 1, timed: bool = False) -> Predictor:
        """The variant as validation runs it: one session with the run's threads, or ``sessions`` sessions of one
        thread each (a multi-session serving plan)."""
        device = self.device if record.engine != "openvino" else "cpu"
        options = EngineOptions.for_variant(record, self.threads if sessions == 1 else 1, device)
        if not timed:  # validation: no arena held between its few big batches (EngineOptions.memory_arena)
            options = dataclasses.replace(options, memory_arena=False)
        path = self.ctx.stage / record.path
        if record.engine in PROBED_ENGINES:  # a native crash here would end kiln optimize with nothing written
            crash = self.probe.crash(record.engine, path, options)
            if crash is not None:
                raise NativeCrashError(f"{crash}, with {options.intra_op_threads} thread(s) and the "
                                       f"{options.precision} inference precision")
        engines = [create_engine(record.engine, path, options) for _ in range(sessions)]
        return Predictor(task_handler(self.source.task_config), self.reference.encoder, engines[0],
                         batch_size=self.config.batch_size,
                         sessions=engines[1:])

    def _free_the_model_unless(self, remaining: list[str]) -> None:
        """Drop the PyTorch weights (moved to the meta device: any later use fails loudly, nothing computes on
        stale memory) once the fp32 export exists and no variant in ``remaining`` reads the model. Its structure and
        config stay: the manifest's parameter count reads shapes only."""
        if any(VARIANTS[n].needs_model(self.ctx) for n in remaining):
            return
        if not self.ctx.built("onnx-fp32"):
            # The artifact keeps the fp32 export as its reference (and OpenVINO converts it): a decoder whose
            # onnx-fused replaced onnx-fp32 has not made it yet, and must while the weights are here.
            self.progress("exporting onnx-fp32 (the artifact's reference)")
            try:
                self.ctx.fp32_onnx()
            except Exception as err:  # as _reference_variant: said here, recorded as missing at the end
                stop_if_no_room(err)
                self.progress(f"onnx-fp32 export failed ({type(err).__name__}: {err}); the PyTorch weights are kept")
                return
        for source in {id(s): s for s in (self.source, self.original)}.values():
            if next(source.model.parameters()).device.type != "meta":
                source.model.to("meta")
                self.progress(f"{source.name}: PyTorch weights freed (no variant left to build reads them)")

    def _time_reference(self) -> tuple[Timing, str]:
        self.progress(f"timing the PyTorch fp32 reference on {len(self.work.timing)} sequences")
        return time_original(self.original, self.work.timing, self.config.batch_size, self.threads, self.device)

    def _time(self, outcome: Outcome) -> Outcome:
        timed = (Status.ACCEPTED, Status.REJECTED) if self.config.time_rejected else (Status.ACCEPTED,)
        if outcome.status not in timed or outcome.record is None or outcome.timing is not None:
            return outcome
        self.progress(f"timing {outcome.name}")
        try:
            return dataclasses.replace(outcome, timing=time_predictor(self._predictor(outcome.record, timed=True),
                                                                      self.work.timing))
        except Exception as err:  # an engine that validates but cannot be timed is a failed variant, said so
            return dataclasses.replace(outcome, status=Status.FAILED, reason=f"timing: {type(err).__name__}: {err}")

    def _summary(self, outcomes: list[Outcome], best: Outcome | None, reference_timing: Timing,
                 attention: str) -> RunSummary:
        return RunSummary(
            model=self.source.name, task=self.spec.name, tolerance=self.tolerance,
            primary_metric=self.spec.validation.metric if self.work.eval_set is not None else None,
            reference_metric=self.work.reference_metric, reference_timing=reference_timing,
            outcomes=tuple(outcomes), best=best.name if best else None, command=invocation(),
            baseline_attention=attention, calibration=self.work.calibration_source,
            reference=self.original.name if self.original is not self.source else "",
            environment={"cpu": self.cpu.to_dict(), "threads": self.threads, "versions": library_versions()},
        )

    def _manifest(self, summary: RunSummary, tokenizer: TokenizerRecord) -> Manifest:
        outcomes, timing = summary.outcomes, summary.reference_timing
        return Manifest(
            source=self.described[0], task=self.source.task_config, tokenizer=tokenizer,
            variants={o.name: o.recorded() for o in outcomes if o.record},
            build=BuildRecord(
                best=summary.best, skipped={o.name: o.reason for o in outcomes if not o.record},
                tolerance=self.tolerance, cpu=self.cpu.to_dict(), calibration=self.work.calibration_source,
                reference_timing=ReferenceTiming(timing.sequences, timing.seconds, timing.batch_size,
                                                 summary.baseline_attention, timing.new_tokens),
                eval=self.work.eval_set.source if self.work.eval_set is not None else None,
                reference=self.described[1] if self.original is not self.source else None,
                reference_metric=self.work.reference_metric, device=self.device),
        )

    def _output_calibration(self, kept: VariantRecord | None) -> str | None:
        """Embedding tasks: the kept fp32 reference's vectors of the calibration texts, written beside the manifest;
        int8/uint8 output precision takes its per-dimension ranges from them (kiln.runtime.precision), so every
        server and job quantizes a text to the same bytes. None for other tasks, or without a kept reference."""
        if not (self.spec.embeds or self.spec.multi_vectors) or kept is None:
            return None
        # The user's calibration texts when given (their traffic); else more built-in ones than int8 variants
        # calibrate on: 128 texts left the MiniLM's int8 ranges narrow (recall@10 0.970), 512 give 0.98 (same split).
        texts = self.work.calibration if self.config.calibration_file else \
            self.spec.validation.calibration_inputs(self.reference.encoder, OUTPUT_CALIBRATION_TEXTS)
        return write_output_calibration(self.ctx.stage, self._predictor(kept), texts)

    def _stored_vectors(self, best: Outcome | None, calibration: str | None) -> tuple[StoredVectors, ...]:
        """With --precisions: what each stored (size, precision) of the best variant's vectors costs in retrieval."""
        if not self.config.precisions or best is None or best.record is None or calibration is None:
            return ()
        return measure_stored_vectors(self.config, self._predictor(best.record), np.load(self.ctx.stage / calibration),
                                      self.progress, self.work.eval_set)

    def _reference_variant(self) -> VariantRecord | None:
        """The fp32 export, kept as the artifact's reference for live agreement (kiln serve --shadow-rate); built
        now if no variant needed it. None where it cannot be built (the run's export failed for every variant)."""
        try:
            return self.ctx.fp32_onnx().record()
        except Exception as err:  # recorded as missing, said once: shadowing is then refused with this reason
            stop_if_no_room(err)
            self.progress(f"no fp32 reference kept for live agreement ({type(err).__name__}: {err})")
            return None

    def _prune(self, outcomes: list[Outcome], reference: VariantRecord | None = None) -> None:
        """Remove intermediates no recorded variant (or the kept reference) uses (e.g. a fused graph built only to
        quantize)."""
        used = {Path(f).parts[0] for o in outcomes if o.record for f in o.record.files}
        used |= {Path(f).parts[0] for f in (reference.files if reference else ())}
        for child in self.ctx.stage.iterdir():
            if child.is_dir() and child.name not in used | {"tokenizer"}:
                shutil.rmtree(child)


def gate_verdict(task: str, batched: BatchedAgreement, metric: dict[str, float] | None,
                 reference_metric: dict[str, float] | None, tolerance: float) -> Verdict:
    """The gate on a variant's agreement under its worst batching (named when not the sorted one), its task
    metric against the original's, and its drift between batchings."""
    worst, key = batched.worst, task_spec(task).validation.metric
    verdict = judge(task, batched.agreements[worst], tolerance, metric[key] if metric else None,
                    reference_metric[key] if reference_metric else None)
    if worst is not Batching.SORTED:
        verdict = dataclasses.replace(verdict, reason=f"{verdict.reason} ({WORST_WORDS[worst]})")
    return judge_drift(verdict, batched.drift, tolerance)


def _released(value: T) -> T:
    """``value``, once the memory freed while computing it is given back (kiln.system.memory)."""
    release_freed()
    return value


def time_original(original: SourceModel, timing: tuple[Encoding, ...], batch_size: int,
                  threads: int, device: str = "cpu") -> tuple[Timing, str]:
    """The original's PyTorch fp32 on the timing inputs (vanilla attention where it has a choice), and which
    attention that was: the baseline every speed-up is against, on the device the variants are timed on."""
    reference = timing_predictor(original, batch_size=batch_size, threads=threads, device=device)
    with vanilla_attention(original.model) as attention:
        return time_predictor(reference, timing), attention


def write_output_calibration(stage: Path, predictor: Predictor, texts: list[Any]) -> str:
    """The fp32 vectors of ``texts``, written beside the manifest: int8/uint8 output precision's ranges."""
    np.save(stage / CALIBRATION_FILE, predictor.handler.output_vectors(predictor, texts), allow_pickle=False)
    return CALIBRATION_FILE


def measure_stored_vectors(config: OptimizeConfig, predictor: Predictor, calibration: np.ndarray,
                           progress: Progress, eval_set: EvalSet | None = None) -> tuple[StoredVectors, ...]:
    """--precisions: recall@10 of the full-size float32 neighbours, memory and search speed of each stored
    (size, precision) of ``predictor``'s vectors of held-out sentences, and NDCG@10 on the user's --eval
    judgements where the task reads them as such, each judged against the tolerance."""
    from kiln.validation.stored_vectors import JudgedVectors, measure, measure_token_vectors, retrieval_corpus

    texts = retrieval_corpus()
    progress(f"measuring stored-vector retrieval on {len(texts)} held-out sentences "
             f"({', '.join(p.value for p in config.precisions)}; sizes {config.matryoshka_dims or 'full'})")
    spec = task_spec(config.task)
    # A late-interaction model's queries are encoded as queries, and its results are kept as lists of token vectors.
    as_queries = {"is_query": True} if spec.multi_vectors else {}

    def vectors(inputs: list[str], **options: Any) -> Any:
        found = predictor.predict(inputs, **options)
        return found if spec.multi_vectors else np.stack(found).astype(np.float32)

    judgements = spec.validation.retrieval_judgements(eval_set) if eval_set is not None else None
    judged = None
    if judgements is not None:
        progress(f"and NDCG@10 of {len(judgements.queries)} queries over {len(judgements.documents)} texts of "
                 f"{judgements.source}")
        judged = JudgedVectors(vectors(judgements.queries, **as_queries), vectors(judgements.documents),
                               judgements.relevance)
    if spec.multi_vectors:
        return measure_token_vectors(vectors(texts[:100], **as_queries), vectors(texts[100:]), calibration,
                                     config.precisions, config.retrieval_tolerance, judged)
    return measure(vectors(texts), 100, calibration, config.matryoshka_dims, config.precisions,
                   config.retrieval_tolerance, predictor.config.normalize, judged)


def _check_comparable(model: SourceModel, reference: SourceModel) -> None:
    """Variants of ``model`` are compared with ``reference`` on the same token ids and the same result shapes."""
    if model.tokenizer.backend_tokenizer.to_str() != reference.tokenizer.backend_tokenizer.to_str():
        raise UsageError(f"reference {reference.name}: its tokenizer differs from {model.name}'s; kiln compares "
                         "both on the same token ids (a student made by kiln distill keeps its teacher's)")
    mine, theirs = model.task_config.to_dict(), reference.task_config.to_dict()
    differ = [k for k in mine if k != "max_length" and mine[k] != theirs[k]]
    if task_spec(model.task_config.task).embeds and model.model.config.hidden_size != \
            reference.model.config.hidden_size:
        differ.append("embedding size")
    if differ:
        raise UsageError(f"reference {reference.name}: its task settings differ from {model.name}'s "
                         f"({', '.join(differ)}), so their outputs cannot be compared")


def _device_for(target: str, progress: Progress) -> str:
    """Validate and time on the GPU for --target cuda when ONNX Runtime can use one; say so when not."""
    if target != "cuda":
        return "cpu"
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return "cuda"
    progress("--target cuda: no CUDA execution provider here; variants are validated and timed on the CPU")
    return "cpu"


def judging_order(names: list[str]) -> list[str]:
    """The variants without an int8 search first, then those with one, each in the order asked. A failing int8
    variant whose fully int8 graph is no faster than the fastest variant accepted so far is rejected before any
    search (``_slower_than_best``): judged after every other variant, it meets the fastest of them. `make demo`'s
    kiln optimize on all-MiniLM-L6-v2, one after the other on a 2-core AMX Xeon: 387 s in the default
    order, which searched onnx-int8-dynamic and -rows against onnx-fused alone (accepted at 15.8 and 13.2 ms a text,
    slower than torch-bf16's 8.1, judged later); 360 s in this one, with 25% more agreement texts, torch-bf16 (6.1
    ms) ending every int8 search before it began."""
    return sorted(names, key=lambda name: VARIANTS[name].rank is not None)


def accepted_and_timed(outcomes: list[Outcome]) -> list[Outcome]:
    """The outcomes a choice is made among: accepted, with their timing."""
    return [o for o in outcomes if o.status is Status.ACCEPTED and o.timing]


def choose(outcomes: list[Outcome]) -> Outcome | None:
    """Fastest accepted variant; within TIE of the fastest, the smallest file wins."""
    timed = accepted_and_timed(outcomes)
    if not timed:
        return None
    fastest = min(o.timing.ms_per_sequence for o in timed)
    tied = [o for o in timed if o.timing.ms_per_sequence <= fastest * (1 + TIE)]
    return min(tied, key=lambda o: (o.size_bytes, o.timing.ms_per_sequence))


def _nothing_passed(outcomes: list[Outcome]) -> str:
    """The first failure leads (the variants built from it were only skipped for it), then every outcome."""
    failed = next((o for o in outcomes if o.status is Status.FAILED), None)
    lines = "; ".join(f"{o.name} {o.status.value}: {o.reason}" for o in outcomes)
    if failed is not None:
        return f"no variant passed the gate; first, {failed.name} failed: {failed.reason} (all: {lines})"
    return f"no variant passed the gate ({lines}). Raise --tolerance or check the model"


def write_best(stage: Path, manifest: Manifest, name: str) -> None:
    """A self-contained artifact of the chosen variant in ``best/`` (servable on its own)."""
    copy_variant(stage, manifest, name, stage / BEST_DIR)


def _with_matryoshka(source: SourceModel, dims: tuple[int, ...]) -> SourceModel:
    """``source`` with its task settings declaring the Matryoshka sizes (checked against its embedding size)."""
    if not dims:
        return source
    size = source.task_config.dimension
    if size is not None and max(dims) > size:
        raise UsageError(f"matryoshka_dims must be at most the embedding size {size} of {source.name} "
                         f"(got {','.join(map(str, dims))})")
    source.task_config = dataclasses.replace(source.task_config, matryoshka_dims=tuple(sorted(set(dims),
                                                                                              reverse=True)))
    return source
