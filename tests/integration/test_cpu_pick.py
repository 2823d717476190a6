"""Portable artifacts: the variant a CPU runs is one validated on its class, re-validated once where it is new."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from typer.testing import CliRunner

from kiln.artifact import cpu_pick, emulation
from kiln.artifact.directory import Artifact
from kiln.cli.app import app
from kiln.errors import UsageError
from kiln.optimizing.job import OptimizeConfig, OptimizeJob
from kiln.system.cpu import ONEDNN_ISA, cpu_class, cpu_info, emulable_classes
from kiln.tasks import TaskName

HERE = cpu_class(cpu_info().features)
ELSEWHERE = "avx2" if HERE != "avx2" else "avx512-vnni"  # a class this artifact was not validated on


@pytest.fixture(scope="module")
def portable(tiny_model, tmp_path_factory):
    """kiln optimize of the tiny BERT with two variants, asked --for this CPU's class and another."""
    out = tmp_path_factory.mktemp("portable") / "out"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("onnx-fp32", "onnx-int8-dynamic"), for_classes=(HERE, ELSEWHERE))).run()
    return out


def test_optimize_stores_the_agreement_inputs_and_the_classes_it_could_not_check(portable):
    build = Artifact.open(portable).manifest.build
    inputs = json.loads((portable / build.agreement_inputs).read_text())
    assert len(inputs) >= 32 and all(isinstance(t, str) for t in inputs)
    assert list(build.unchecked_classes) == [ELSEWHERE]  # this CPU's class is validated, not recorded
    # No OpenVINO variant to cap, so nothing was judged for it here; it names what happens instead.
    assert "re-validated on the stored agreement inputs the first time" in build.unchecked_classes[ELSEWHERE]
    assert build.emulated_classes == {}
    best = Artifact.open(portable / "best").manifest.build  # the copy carries what re-validates it
    assert best.cpu == build.cpu and (portable / "best" / best.agreement_inputs).is_file()


def test_for_names_its_allowed_classes():
    with pytest.raises(UsageError, match="for_classes takes CPU classes of: amx, avx512-vnni"):
        OptimizeConfig(model=None, task="feature-extraction", output=None, for_classes=("avx3",))


def test_the_building_class_runs_the_recorded_best_unchecked(portable, monkeypatch):
    monkeypatch.delenv(cpu_pick.CLASS_OVERRIDE, raising=False)
    art = Artifact.open(portable)
    pick = art.cpu_pick()
    assert pick.variant == art.manifest.build.best and pick.checked == {} and HERE in pick.reason


def test_a_new_class_re_validates_every_accepted_variant_once_and_caches_it(portable, tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_pick.CLASS_OVERRIDE, ELSEWHERE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    art = Artifact.open(portable)
    accepted = {n for n, r in art.manifest.variants.items() if r.status.value == "accepted"}
    pick = art.cpu_pick()
    assert set(pick.checked) == accepted and pick.cpu_class == ELSEWHERE and pick.built_on == HERE
    passed = {n: c for n, c in pick.checked.items() if c["accepted"]}
    assert pick.variant == min(passed, key=lambda n: passed[n]["ms_per_input"])  # the fastest that passes
    assert "re-validated on" in pick.reason and art.variant_name() == pick.variant
    assert (portable / cpu_pick.PICKS_DIR / f"{ELSEWHERE}.json").is_file()

    def never(*_):
        raise AssertionError("re-validated again instead of reading the cached verdict")

    monkeypatch.setattr(cpu_pick, "_revalidate", never)
    assert Artifact.open(portable).cpu_pick() == pick  # the cache, keyed by the manifest, answers
    result = CliRunner().invoke(app, ["info", str(portable)])
    assert result.exit_code == 0 and f"runs here  {pick.variant}: re-validated on {ELSEWHERE}" in result.output
    for name, record in art.manifest.variants.items():  # each variant's line says how the gate judged it
        line = next(x for x in result.output.splitlines() if x.startswith(f"variant    {name}"))
        assert f"; {record.status.value}: {record.reason}" in line, line
    assert f"unchecked  {ELSEWHERE}:" in result.output


def test_a_read_only_artifact_caches_under_the_user_cache(portable, tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_pick.CLASS_OVERRIDE, "baseline")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    blocked = tmp_path / "read-only"
    blocked.write_text("a file where the cache directory would go: mkdir fails as on a read-only artifact")
    monkeypatch.setattr(cpu_pick, "_places", lambda art, here, key: [blocked / cpu_pick.PICKS_DIR / f"{here}.json",
                                                                 tmp_path / "kiln" / f"{here}.json"])
    pick = Artifact.open(portable).cpu_pick()
    assert json.loads((tmp_path / "kiln" / "baseline.json").read_text())["pick"]["variant"] == pick.variant


def test_when_nothing_passes_on_the_new_class_the_best_runs_with_a_warning(portable, tmp_path, monkeypatch,
                                                                           caplog):
    """Fault injection: the gate refuses every variant on this class."""
    from kiln.validation import gate

    monkeypatch.setenv(cpu_pick.CLASS_OVERRIDE, "amx" if HERE != "amx" else "avx2")
    monkeypatch.setattr(cpu_pick, "_places", lambda art, here, key: [tmp_path / f"{here}.json"])
    real = gate.judge
    monkeypatch.setattr(gate, "judge", lambda *a, **k: dataclasses.replace(real(*a, **k), accepted=False,
                                                                           reason="refused by the test"))
    with caplog.at_level(logging.WARNING, logger="kiln"):
        art = Artifact.open(portable)
        pick = art.cpu_pick()
    assert pick.variant == art.manifest.build.best and not any(c["accepted"] for c in pick.checked.values())
    assert "no variant passed re-validation" in pick.reason and "no variant passed" in caplog.text


def test_an_artifact_timed_on_a_gpu_keeps_its_choice_on_any_cpu(portable, tmp_path, monkeypatch):
    """kiln optimize --target cuda timed its variants on the GPU: re-timing them on the loading machine's CPU would
    pick for the wrong processor, so the recorded best stands, said so."""
    import shutil

    from kiln.artifact.manifest import read_manifest, seal

    gpu = tmp_path / "gpu"
    shutil.copytree(portable, gpu, ignore=shutil.ignore_patterns(cpu_pick.PICKS_DIR))
    manifest = read_manifest(gpu)
    seal(gpu, dataclasses.replace(manifest, build=dataclasses.replace(manifest.build, device="cuda")))
    monkeypatch.setenv(cpu_pick.CLASS_OVERRIDE, ELSEWHERE)

    def never(*_):
        raise AssertionError("re-validated GPU-timed variants on the CPU")

    monkeypatch.setattr(cpu_pick, "_revalidate", never)
    pick = Artifact.open(gpu).cpu_pick()
    assert pick.variant == manifest.build.best and pick.checked == {}
    assert "timed on cuda by kiln optimize --target cuda" in pick.reason
    from kiln.artifact.directory import extract_variant

    copy = extract_variant(Artifact.open(gpu), pick.variant, tmp_path / "copy")  # as kiln writes best/
    assert Artifact.open(copy).manifest.build.device == "cuda"


LESSER = next((c for c in ("avx2", "avx512-vnni") if c in emulable_classes(cpu_info())), None)


@pytest.mark.skipif(LESSER is None, reason="this CPU has no lesser class to cap OpenVINO to")
def test_for_a_lesser_class_judges_the_openvino_variants_under_onednns_cap(tiny_model, tmp_path, monkeypatch):
    """--for a class with fewer instructions than this CPU's: each OpenVINO variant is judged in a process with
    ONEDNN_MAX_CPU_ISA set, and the kernels its MatMuls ran prove the cap took; ONNX Runtime's are left for load."""
    out = tmp_path / "out"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("onnx-fp32", "openvino-fp32"), for_classes=(LESSER,))).run()
    build = Artifact.open(out).manifest.build
    run = build.emulated_classes[LESSER]
    assert run["isa"] == ONEDNN_ISA[LESSER] and list(run["variants"]) == ["openvino-fp32"]  # ORT cannot be capped
    verdict = run["variants"]["openvino-fp32"]
    assert verdict["accepted"] and verdict["ms_per_input"] > 0
    capped = [k for k in verdict["kernels"] if "mlas" not in k]  # MLAS picks by CPUID: said, not counted
    assert capped and not any("amx" in k for k in capped)
    if LESSER == "avx2":
        assert not any("avx512" in k for k in capped), verdict["kernels"]
    assert "ONNX Runtime" in build.unchecked_classes[LESSER]
    assert Artifact.open(out / "best").manifest.build.emulated_classes == build.emulated_classes
    shown = CliRunner().invoke(app, ["info", str(out)])
    assert shown.exit_code == 0 and f"emulated   {LESSER} (oneDNN capped to {ONEDNN_ISA[LESSER]})" in shown.output

    # Fault injection: a capped process that does not finish is recorded as such, and the artifact is still built.
    monkeypatch.setattr(emulation, "TIMEOUT_S", 0.01)
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "b",
                               variants=("openvino-fp32",), for_classes=(LESSER,))).run()
    failed = Artifact.open(tmp_path / "b").manifest.build
    assert "did not finish" in failed.emulated_classes[LESSER]["error"]
    assert "failed" in failed.unchecked_classes[LESSER]
