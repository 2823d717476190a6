"""kiln optimize --distill-layers / --prune: students made, optimized, judged against the model, on one frontier."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kiln.data import corpus
from kiln.errors import UsageError
from kiln.optimizing.students import parse_students


def test_student_requests_and_their_errors():
    three, pruned = parse_students("3", ["ffn=0.5,heads=0.25"])
    assert (three.name, three.slug, three.layers) == ("3 layers", "3-layers", 3)
    assert pruned.prune.ffn == 0.5 and pruned.prune.heads == 0.25 and pruned.slug == "pruned-ffn0.5-heads0.25"
    for args, message in ((("3,x", []), "distill_layers takes comma-separated layer counts"),
                          (("0", []), "at least 1 layer"),
                          ((None, ["ffn:0.5"]), "prune takes key=value pairs with keys ffn, heads, scope"),
                          ((None, ["ffn=half"]), "prune ffn must be a number"),
                          ((None, ["ffn=1.5"]), "ffn is the share to remove"),
                          (("2,2", []), "the same student is asked for twice")):
        with pytest.raises(UsageError, match=message):
            parse_students(*args)


def test_optimize_builds_students_and_plots_their_frontier(tiny_model, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(corpus.sentences("calibration")[:100]) + "\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "kiln", "optimize", str(tiny_model("bert")), "--variants",
                           "onnx-fp32,onnx-int8-dynamic", "--distill-layers", "1", "--prune", "ffn=0.5",
                           "--student-texts", str(texts), "--student-epochs", "1", "--threads", "1", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "frontier: " in done.stdout and (out / "manifest.json").is_file()  # the model's own artifact as ever
    frontier = json.loads((out / "frontier.json").read_text())
    by_model: dict[str, dict[str, dict]] = {}
    for point in frontier["points"]:
        by_model.setdefault(point["model"], {})[point["variant"]] = point
    assert set(by_model) == {"model", "1 layer", "pruned ffn=0.5"}
    # students are optimized with the model's own --variants, not every default
    assert all(set(variants) <= {"onnx-fp32", "onnx-int8-dynamic"} for variants in by_model.values())
    assert by_model["model"]["onnx-fp32"]["agreement"] > 0.9999
    # a student is judged against the model, not itself: its exact export carries the student's own loss
    assert by_model["1 layer"]["onnx-fp32"]["agreement"] < 0.99
    # and every built variant is timed, rejected or not, so the chart shows what each would buy
    assert all(p["speedup"] is not None for variants in by_model.values() for p in variants.values())
    assert frontier["frontier"] and "<svg" in (out / "frontier.html").read_text()
    for slug in ("1-layer", "pruned-ffn0.5"):
        assert (out / "students" / slug / "model" / "config.json").is_file()
