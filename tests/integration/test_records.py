"""A manifest is typed, and a schema-1 manifest written before typed records still reads."""

from __future__ import annotations

import pytest

from kiln.errors import ArtifactError


def test_a_manifest_is_typed_and_a_schema_1_manifest_still_reads(tiny_artifact, tmp_path):
    """Manifests are records (fields, not string keys); an artifact written before typed records (schema_version
    1, the run's notes under ``extra``) opens and serves as before."""
    import json
    import shutil

    from kiln.artifact.directory import Artifact
    from kiln.artifact.manifest import MANIFEST_NAME, SCHEMA_VERSION, read_manifest
    from kiln.records.artifact import TokenizerRecord

    manifest = read_manifest(tiny_artifact)
    record = manifest.variants["onnx-fp32"]
    assert manifest.schema_version == SCHEMA_VERSION == 2
    assert isinstance(manifest.tokenizer, TokenizerRecord) and record.engine == "onnxruntime"
    assert record.parity.min_cosine > 0.9999 and manifest.build.best == "onnx-fp32"
    old = tmp_path / "old"
    shutil.copytree(tiny_artifact, old)
    body = json.loads((old / MANIFEST_NAME).read_text())
    body["schema_version"], body["extra"] = 1, body.pop("build")  # as kiln wrote it before typed records
    body["extra"]["serving_default"] = {"variant": "onnx-fp32", "sessions": 1, "threads": 1, "batch_size": 8,
                                        "pad_multiple": 1}
    body["variants"]["onnx-fp32"]["parity"]["passed"] = True  # a derived key the old writer added
    (old / MANIFEST_NAME).write_text(json.dumps(body))
    art = Artifact.open(old)
    assert art.manifest.build.best == "onnx-fp32" and art.serving_default().batch_size == 8
    assert art.predictor().batch_size == 8 and len(art.predictor().predict(["still serves"])) == 1
    body["schema_version"] = 99
    (old / MANIFEST_NAME).write_text(json.dumps(body))
    with pytest.raises(ArtifactError, match="has schema_version 99; this kiln reads schema_version 1, 2"):
        read_manifest(old)


