"""What every variant build shares: the source, the staging directory, calibration data, CPU facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.choices import CalibrationMethod, ExportFormat, Target
from kiln.export.job import ExportConfig, export_variant
from kiln.model.reference import example_inputs, task_module
from kiln.model.source import SourceModel
from kiln.runtime.tokenization import TextEncoder
from kiln.system.cpu import CpuInfo, Int8Scheme


@dataclass
class BuiltVariant:
    """One variant's files in the staging directory and the recipe that made them."""

    name: str
    engine: str
    path: str  # model file, relative to the artifact root
    files: list[str]  # every file the variant needs (may be shared with another variant)
    recipe: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)  # engine options: precision, streams

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.engine, "path": self.path, "files": self.files,
                "recipe": self.recipe, "options": self.options}


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
    _cache: dict[str, Any] = field(default_factory=dict)

    def once(self, key: str, build):
        """Build a shared intermediate (fp32 ONNX, fused graph, OpenVINO IR) at most once."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def fp32_onnx(self) -> BuiltVariant:
        def build() -> BuiltVariant:
            config = ExportConfig(model=None, task=self.source.task_config.task, format=ExportFormat.ONNX,
                                  output=self.stage)
            return BuiltVariant(**{k: v for k, v in export_variant(self.source, config, self.stage).items()})
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
