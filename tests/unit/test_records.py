"""Typed records <-> JSON: schema-versioned, atomic, rebuilt with their types; another schema is refused."""

from __future__ import annotations

import pytest

from kiln.errors import ArtifactError
from kiln.optimizing.outcome import Outcome
from kiln.records import read_record, write_json
from kiln.records.artifact import Round, Sensitivity, Status, VariantRecord
from kiln.records.figures import Agreement, BucketFigure
from kiln.records.timing import Timing


def test_a_record_comes_back_with_its_types(tmp_path):
    outcome = Outcome("v", Status.ACCEPTED, "ok", record=VariantRecord("v", "onnxruntime", "v/model.onnx",
                                                                     ("v/model.onnx",), ({"pass": "export-onnx"},)),
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


def test_a_variant_says_how_it_fared_in_one_line():
    """kiln info's line per variant: the gate's verdict in its words, the build machine's speed and the batch drift
    after kiln optimize; a plain export's parity; nothing recorded said as such."""
    from kiln.choices import Batching
    from kiln.records.batching import BatchDrift, BatchedAgreement

    agreement = Agreement("min_cosine", 0.9941, {"min_cosine": 0.9941}, "cosine", ())
    plain = VariantRecord("v", "onnxruntime", "v/model.onnx", ("v/model.onnx",))
    assert plain.summary() == "no parity recorded"
    rejected = VariantRecord("q", "onnxruntime", "q/model.onnx", ("q/model.onnx",), status=Status.REJECTED,
                             reason="min_cosine 0.8544 < 0.9900", agreement=agreement)
    assert rejected.summary() == "rejected: min_cosine 0.8544 < 0.9900"
    drift = BatchDrift(max_abs_diff=0.028, min_cosine=0.99006, consistency=0.9901, figure="min_cosine")
    accepted = VariantRecord("i", "openvino", "i/model.xml", ("i/model.xml",), reason="min_cosine 0.9941 >= 0.9900",
                             agreement=agreement, timing=Timing(256, 1.6, 32),
                             batched=BatchedAgreement({Batching.SORTED: agreement}, drift))
    assert accepted.summary() == ("accepted: min_cosine 0.9941 >= 0.9900; 160.0 seq/s at batch 32 when built; "
                                  "moves with the batch: max abs diff 2.8e-02, min cosine 0.99006 (min_cosine 0.9901)")
