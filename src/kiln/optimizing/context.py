"""What every variant build shares: the source, the staging directory, calibration data, CPU facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.choices import CalibrationMethod, ExportFormat, Target
from kiln.exporting.job import ExportConfig, export_variant
from kiln.records.artifact import EngineHints, VariantRecord
from kiln.runtime.tokenization import TextEncoder
from kiln.source.loading import SourceModel
from kiln.source.reference import example_inputs, task_module
from kiln.system.cpu import CpuInfo, Int8Scheme


class DependencyFailed(Exception):
    """A variant is built from one that failed (its files are gone): it is skipped, naming that one."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name} failed ({reason})")
        self.name, self.reason = name, reason


@dataclass
class BuiltVariant:
    """One variant's files in the staging directory and the recipe that made them."""

    name: str
    engine: str
    path: str  # model file, relative to the artifact root
    files: list[str]  # every file the variant needs (may be shared with another variant)
    recipe: list[dict[str, Any]]
    options: EngineHints = EngineHints()  # precision hint, streams

    def record(self) -> VariantRecord:
        return VariantRecord(self.name, self.engine, self.path, tuple(self.files), tuple(self.recipe), self.options)


@dataclass
class BuildContext:
    source: SourceModel
    stage: Path
    encoder: TextEncoder
    calibration: list[Any]  # texts (or QA pairs) the int8 passes calibrate on
    cpu: CpuInfo
    scheme: Int8Scheme
    target: Target
    calibration_method: CalibrationMethod = CalibrationMethod.MINMAX
    scratch: Path | None = None  # temporary files that never enter the artifact (calibration caches)
    device: str = "cpu"  # where variants are validated and timed (cuda for --target cuda on a CUDA machine)
    _cache: dict[str, Any] = field(default_factory=dict)
    _failed: dict[str, str] = field(default_factory=dict)  # variant -> why it failed (its files were removed)

    def once(self, key: str, build):
        """Build a shared intermediate (fp32 ONNX, fused graph, OpenVINO IR) at most once; DependencyFailed when
        the variant of that name failed (a PyLate checkpoint's onnx-fp32 failing its check took every variant
        built from its files along, each with "No such file" instead of the cause)."""
        if key in self._failed:
            raise DependencyFailed(key, self._failed[key])
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def failed(self, key: str, reason: str) -> None:
        """The variant ``key`` failed and its files are gone: whatever is built from it is skipped from now on."""
        self._failed[key] = reason
        self._cache.pop(key, None)

    def built(self, key: str) -> bool:
        """Whether the shared intermediate ``key`` has been built (``once``)."""
        return key in self._cache

    def fp32_onnx(self) -> BuiltVariant:
        def build() -> BuiltVariant:
            config = ExportConfig(model=None, task=self.source.task_config.task, format=ExportFormat.ONNX,
                                  output=self.stage)
            record = export_variant(self.source, config, self.stage)
            return BuiltVariant(record.name, record.engine, record.path, list(record.files), list(record.recipe))
        return self.once("onnx-fp32", build)

    def variant_dir(self, name: str) -> Path:
        directory = self.stage / name
        directory.mkdir(exist_ok=True)
        return directory

    def calibration_batches(self, batch_size: int = 1) -> list[dict[str, np.ndarray]]:
        """Model inputs for calibration: one feature per batch by default, so no padding skews ranges."""
        def build() -> list[dict[str, np.ndarray]]:
            from kiln.tasks import task_handler

            handler = task_handler(self.source.task_config)
            prepared = handler.features(self.calibration, self.encoder)
            encs = prepared.encodings
            return [handler.graph_feed(self.encoder.collate(encs[i : i + batch_size]))
                    for i in range(0, len(encs), batch_size)]
        return self.once(f"calibration-{batch_size}", build)

    def module(self):
        return self.once("module", lambda: task_module(self.source))

    def example(self):
        return self.once("example", lambda: example_inputs(self.source))

    @property
    def task(self) -> str:
        return self.source.task_config.task

    @property
    def spec(self):
        from kiln.tasks import task_spec

        return task_spec(self.task)
