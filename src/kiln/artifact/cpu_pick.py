"""Which variant to run on the CPU at hand, when it is not the CPU kiln optimize validated on.

int8 and bf16 kernels differ by CPU class (AVX2's u8s8 with 7-bit weights, VNNI's VPDPBUSD, AMX tiles), so both a
variant's speed and its answers can change when an artifact built on one class is loaded on another. kiln optimize
records the building CPU and stores the inputs it judged every variant on (``BuildRecord.agreement_inputs``). On
the same class, the recorded best is run. On another class, every accepted variant is judged again, here, on those
inputs against the kept fp32 reference at the recorded tolerance, and timed on them; the fastest that passes is
run. That verdict is cached per class beside the artifact (``cpu-picks/<class>.json``; under ``~/.cache/kiln`` when
the artifact's directory is read-only), keyed by the manifest's checksum, so it costs seconds once.

KILN_CPU_CLASS names the class kiln takes this CPU for. It changes no kernel: it is how a test (or a person
asking "what would be re-checked on a new class") makes the re-validation run on one machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.log import get_logger
from kiln.records.artifact import Status
from kiln.system.cpu import CpuInfo, cpu_class, cpu_info, emulable_classes

if TYPE_CHECKING:
    from kiln.artifact.directory import Artifact

log = get_logger("artifact.cpu")
PICKS_DIR = "cpu-picks"
AGREEMENT_INPUTS = "agreement_inputs.json"
CLASS_OVERRIDE = "KILN_CPU_CLASS"


@dataclass(frozen=True)
class CpuPick:
    """The variant run on this CPU, and why."""

    variant: str
    cpu_class: str  # this CPU's
    built_on: str  # the class kiln optimize validated on ("" when the artifact does not say)
    reason: str
    # Re-validation on this class: variant -> {"accepted", "reason", "ms_per_input"}; empty when none was needed.
    checked: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def local_class() -> str:
    """This CPU's class (or the one KILN_CPU_CLASS names)."""
    return os.environ.get(CLASS_OVERRIDE) or cpu_class(cpu_info().features)


def pick_variant(artifact: Artifact) -> CpuPick:
    """The variant ``kiln.load``, ``kiln serve``, ``kiln embed`` and Triton run when none is named (module doc)."""
    build = artifact.manifest.build
    best = build.best or next(iter(artifact.manifest.variants), "")
    here = local_class()
    built_on = cpu_class(build.cpu.get("features", ())) if build.cpu else ""
    if build.device != "cpu":  # re-timing GPU variants on this CPU would pick for the wrong processor
        return CpuPick(best, here, built_on, f"validated and timed on {build.device} by kiln optimize --target cuda: "
                       "its choice stands whatever the CPU; name a variant to run another")
    if not built_on or here == built_on:
        why = f"validated by kiln optimize on this CPU class ({here})" if built_on else \
            "the artifact's choice (no building CPU recorded)"
        return CpuPick(best, here, built_on, why)
    cached = _read(artifact, here)
    if cached is not None:
        return cached
    if build.agreement_inputs is None or artifact.reference_variant() is None:
        pick = CpuPick(best, here, built_on,
                       f"kiln optimize validated on {built_on}, this CPU is {here}, and the artifact stores no "
                       "agreement inputs or fp32 reference to re-validate with: its choice runs unchecked here")
        log.warning("%s", pick.reason)
        return pick
    pick = _revalidate(artifact, best, here, built_on)
    _write(artifact, pick)
    return pick


def _revalidate(artifact: Artifact, best: str, here: str, built_on: str) -> CpuPick:
    """Judge and time every accepted variant on the stored inputs, on this CPU."""
    log.info("this CPU is %s; kiln optimize validated on %s: re-validating the variants on its stored inputs",
             here, built_on)
    checked = judge_variants(artifact, [n for n, r in artifact.manifest.variants.items()
                                        if r.status is Status.ACCEPTED], here)
    passed = {n: c for n, c in checked.items() if c["accepted"]}
    if not passed:
        pick = CpuPick(best, here, built_on, f"no variant passed re-validation on {here}; running kiln optimize's "
                       f"choice {best} outside its tolerance here", checked)
        log.warning("%s", pick.reason)
        return pick
    fastest = min(passed, key=lambda n: passed[n]["ms_per_input"])
    return CpuPick(fastest, here, built_on, f"re-validated on {here} (kiln optimize validated on {built_on}): the "
                   f"fastest of {len(passed)} variant(s) within tolerance here", checked)


def judge_variants(artifact: Artifact, names: Sequence[str], here: str,
                   evidence: Callable[[Any], dict[str, Any]] | None = None,
                   verdict_errors: tuple[type[Exception], ...] = ()) -> dict[str, dict[str, Any]]:
    """Each named variant judged on the artifact's stored agreement inputs against its kept fp32 reference, at the
    recorded tolerance, and timed where it passes: variant -> {"accepted", "reason", "ms_per_input"}, with what
    ``evidence`` reads from each predictor after its run added. An error of ``verdict_errors`` while one variant
    loads or runs is that variant's verdict ({"accepted": False, "error": its last line}); the others are still
    judged, on the one reference run."""
    from kiln.artifact.plan import ServingPlan
    from kiln.engines import EngineOptions
    from kiln.runtime.timing import time_predictor
    from kiln.validation.agreement import agreement_inputs, measure_agreement
    from kiln.validation.gate import judge

    build, task = artifact.manifest.build, artifact.task_config.task
    inputs = json.loads((artifact.path / build.agreement_inputs).read_text(encoding="utf-8"))
    reference = artifact.reference_variant()
    data = agreement_inputs(artifact.predictor_of(reference, ServingPlan(EngineOptions.for_variant(reference))),
                            inputs)
    checked: dict[str, dict[str, Any]] = {}
    for name in names:
        record = artifact.manifest.variants[name]
        try:
            predictor = artifact.predictor_of(record, ServingPlan(EngineOptions.for_variant(record)))
            verdict = judge(task, measure_agreement(data, predictor), build.tolerance or 0.01)
            timing = time_predictor(predictor, data.prepared.encodings, rounds=1) if verdict.accepted else None
        except verdict_errors as error:
            checked[name] = {"accepted": False, "error": last_line(str(error), type(error).__name__)}
            log.info("%s on %s: %s", name, here, checked[name]["error"])
            continue
        checked[name] = {"accepted": verdict.accepted, "reason": verdict.reason,
                         "ms_per_input": round(timing.ms_per_sequence, 3) if timing else None,
                         **(evidence(predictor) if evidence else {})}
        log.info("%s on %s: %s%s", name, here, verdict.reason,
                 f", {timing.ms_per_sequence:.2f} ms per input" if timing else "")
    return checked


def last_line(text: str, fallback: str) -> str:
    """The last non-blank line of an error's text (OpenVINO's and a process's stderr end with the cause)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else fallback


def _key(artifact: Artifact) -> str:
    return hashlib.sha256((artifact.path / "manifest.json").read_bytes()).hexdigest()[:16]


def _places(artifact: Artifact, here: str, key: str) -> list[Path]:
    """Where a class's verdict is cached: beside the artifact, else under the user's cache (by manifest ``key``)."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln" / PICKS_DIR / key
    return [artifact.path / PICKS_DIR / f"{here}.json", home / f"{here}.json"]


def _read(artifact: Artifact, here: str) -> CpuPick | None:
    key = _key(artifact)
    for path in _places(artifact, here, key):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if raw.get("manifest") == key and raw.get("pick", {}).get("variant") in artifact.manifest.variants:
            return CpuPick(**raw["pick"])
    return None


def _write(artifact: Artifact, pick: CpuPick) -> None:
    """Atomically, to the first place that takes it; a read-only filesystem everywhere only costs a re-check."""
    key = _key(artifact)
    body = json.dumps({"manifest": key, "pick": pick.to_dict()}, indent=2)
    for path in _places(artifact, pick.cpu_class, key):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(body, encoding="utf-8")
            os.replace(tmp, path)
            return
        except OSError:
            continue
    log.warning("could not cache the %s re-validation anywhere; it will run again", pick.cpu_class)


def store_agreement_inputs(stage: Path, inputs: Sequence[Any]) -> str | None:
    """The inputs every variant was judged on, as JSON beside the manifest (what ``_revalidate`` reads); None
    when they are not plain data (nothing to re-validate with then, said at load)."""
    try:
        body = json.dumps(list(inputs), ensure_ascii=False)
    except TypeError:
        return None
    (stage / AGREEMENT_INPUTS).write_text(body, encoding="utf-8")
    return AGREEMENT_INPUTS


def unchecked_classes(wanted: Sequence[str], cpu: CpuInfo, emulated: Mapping[str, Any] | None = None
                      ) -> dict[str, str]:
    """kiln optimize --for: each class other than this CPU's, with why it was not (or not wholly) validated here.
    ``emulated``: the classes whose OpenVINO variants were judged under oneDNN's ISA cap (kiln.artifact.emulation),
    each with its verdicts or its error."""
    here, cappable = cpu_class(cpu.features), emulable_classes(cpu)
    later = "the variants are re-validated on the stored agreement inputs the first time the artifact loads on a " \
            "CPU of class {}"
    out = {}
    for c in wanted:
        if c == here:
            continue
        run = (emulated or {}).get(c)
        if run is not None and "error" not in run:
            why = (f"this CPU is {here}; its OpenVINO variants were judged with oneDNN capped to {c}'s instructions "
                   f"(emulated_classes), but ONNX Runtime picks its kernels by the CPU it runs on and cannot be "
                   f"capped")
        elif run is not None:
            why = f"this CPU is {here}; judging under oneDNN's {c} cap failed ({run['error']})"
        elif c in cappable:
            why = f"this CPU is {here}; it could cap OpenVINO to {c}'s instructions, but no variant here runs on it"
        else:
            why = (f"this CPU is {here} and lacks {c}'s instructions: no runtime can run {c}'s kernels here (OpenVINO "
                   f"can be capped to fewer instructions, never given more)")
        out[c] = f"{why}; {later.format(c)}"
    return out
