"""Typed records <-> JSON: schema-versioned, atomic, rebuilt with their types; another schema is refused."""

from __future__ import annotations

import pytest

from kiln.bench.measure import Timing
from kiln.errors import ArtifactError
from kiln.optimize.outcome import Outcome, Round, Sensitivity, Status
from kiln.records import read_record, write_json
from kiln.validation.figures import Agreement, BucketFigure


def test_a_record_comes_back_with_its_types(tmp_path):
    outcome = Outcome("v", Status.ACCEPTED, "ok", record={"path": "v/model.onnx"},
                      agreement=Agreement("min_cosine", 0.99, {"min_cosine": 0.99}, "cosine",
                                          (BucketFigure("1-16", 3, 0.995, 0.99),)),
                      timing=Timing(10, 0.5, 2), sensitivity=Sensitivity((("a", 0.1),), (Round(1, 0.98, False),),
                                                                          ("a",), True, 1.1))
    path = tmp_path / "r.json"
    write_json(path, "kiln.test/1", outcome)
    assert read_record(path, "kiln.test/1", Outcome) == outcome
    assert '"ms_per_sequence": 50.0' in path.read_text()  # derived figures are written for readers
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, renamed into place


def test_another_schema_is_refused(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, "kiln.test/1", Timing(1, 1.0, 1))
    with pytest.raises(ArtifactError, match="has schema 'kiln.test/1'; this kiln reads 'kiln.optimize/2'"):
        read_record(path, "kiln.optimize/2", Timing)
