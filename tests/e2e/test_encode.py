"""Predictor.encode side by side with SentenceTransformer.encode on the bundled MiniLM: swapping the import is all."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.choices import ExportFormat
from kiln.data.texts import builtin_sentences
from kiln.errors import UsageError
from kiln.exporting.job import ExportConfig, run_export
from kiln.tasks import TaskName

pytestmark = pytest.mark.slow
ATOL = 2e-5  # ONNX fp32 against PyTorch fp32


@pytest.fixture(scope="module")
def both(minilm_dir, tmp_path_factory):
    from sentence_transformers import SentenceTransformer

    out = tmp_path_factory.mktemp("minilm") / "art"
    run_export(ExportConfig(model=None, task=TaskName.FEATURE_EXTRACTION, format=ExportFormat.ONNX, output=out))
    return SentenceTransformer(str(minilm_dir), device="cpu"), kiln.load(out)


TEXTS = list(builtin_sentences()[:12])


@pytest.mark.parametrize("kwargs", [
    {}, {"normalize_embeddings": True}, {"truncate_dim": 128}, {"truncate_dim": 64, "normalize_embeddings": True},
    {"prompt": "query: "}, {"batch_size": 3},
])
def test_same_vectors_shapes_and_dtypes(both, kwargs):
    st, ours = both
    want, got = st.encode(TEXTS, **kwargs), ours.encode(TEXTS, **kwargs)
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=ATOL)


def test_a_single_string_is_one_vector(both):
    st, ours = both
    want, got = st.encode("kiln makes models fast"), ours.encode("kiln makes models fast")
    assert got.shape == want.shape == (384,)
    np.testing.assert_allclose(got, want, atol=ATOL)


def test_tensors_and_lists_of_tensors(both):
    st, ours = both
    got, want = ours.encode(TEXTS[:3], convert_to_tensor=True), st.encode(TEXTS[:3], convert_to_tensor=True)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want.cpu(), atol=ATOL, rtol=0)
    listed = ours.encode(TEXTS[:3], convert_to_numpy=False)
    assert isinstance(listed, list) and len(listed) == 3 and listed[0].shape == (384,)
    assert isinstance(ours.encode([]), np.ndarray) and ours.encode([]).shape == st.encode([]).shape == (0,)


def test_what_kiln_cannot_honour_is_refused_by_name(both, task_artifacts):
    _, ours = both
    for kwargs, name in (({"precision": "int8"}, "precision"), ({"prompt_name": "query"}, "prompt_name"),
                         ({"output_value": None}, "output_value"), ({"truncate_dim": 0}, "truncate_dim"),
                         ({"truncate_dim": 385}, "truncate_dim must be at most the model's size 384")):
        with pytest.raises(UsageError, match=name):
            ours.encode(TEXTS[:2], **kwargs)
    with pytest.raises(UsageError, match="encode\\(\\) needs a sentence-embedding artifact"):
        kiln.load(task_artifacts[TaskName.TEXT_CLASSIFICATION]).encode(["x"])
