"""Beam search, num_return_sequences and the repetition penalty against transformers' ``generate`` on the same
weights: a tiny GPT-2 whose EOS is a token it often picks, so beams finish early and early stopping and the length
penalty decide; every case token for token, and beam scores to 1e-4."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
import transformers

import kiln
from kiln.choices import ExportFormat
from kiln.errors import UsageError
from kiln.export.job import ExportConfig, run_export
from kiln.tasks import TaskName
from tests.factory import build_tiny_model

PROMPTS = ["the river flows north past the old port", "a train", "The quick"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> tuple[object, object, object, int]:
    """(transformers model, tokenizer, kiln predictor, EOS id), EOS set to a token greedy decoding picks often."""
    directory = build_tiny_model("gpt2", TaskName.TEXT_GENERATION, tmp_path_factory.mktemp("beams") / "model")
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    with torch.no_grad():
        greedy = model.generate(tokenizer(PROMPTS[0], return_tensors="pt").input_ids, max_new_tokens=20,
                                do_sample=False, pad_token_id=0)[0, -20:].tolist()
    eos = Counter(greedy).most_common(3)[-1][0]
    for name in ("config.json", "generation_config.json"):
        if (directory / name).is_file():
            config = json.loads((directory / name).read_text())
            (directory / name).write_text(json.dumps({**config, "eos_token_id": eos}))
    art = directory.parent / "art"
    run_export(ExportConfig(model=str(directory), task=TaskName.TEXT_GENERATION, format=ExportFormat.ONNX, output=art))
    return transformers.AutoModelForCausalLM.from_pretrained(directory).eval(), tokenizer, kiln.load(art), eos


@pytest.mark.parametrize("options", [
    {"num_beams": 4, "num_return_sequences": 3},
    {"num_beams": 3, "length_penalty": 2.0, "early_stopping": True},
    {"num_beams": 5, "length_penalty": -0.5, "early_stopping": "never", "num_return_sequences": 5},
    {"num_beams": 4, "repetition_penalty": 1.3, "num_return_sequences": 2},
    {"num_beams": 2, "length_penalty": 0.0},
    {"num_beams": 4, "length_penalty": 0.5},
    {"repetition_penalty": 1.5},  # greedy, on the logits
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_generation_equals_transformers_generate(gpt2, options):
    model, tokenizer, predictor, eos = gpt2
    results = predictor.generate(PROMPTS, max_new_tokens=16, **options)
    stopped = 0
    for prompt, mine in zip(PROMPTS, results):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0,
                                 output_scores=True, return_dict_in_generate=True, **options)
        mine = mine if isinstance(mine, list) else [mine]
        assert len(mine) == options.get("num_return_sequences", 1)
        for row, got in zip(out.sequences[:, ids.shape[1]:].tolist(), mine):
            # transformers pads a shorter beam with its fill value (pad 0 is falsy there: EOS)
            assert list(got.token_ids) == row[: len(got.token_ids)] and set(row[len(got.token_ids):]) <= {eos}
            assert got.finish_reason == ("stop" if got.token_ids[-1] == eos else "length")
            assert got.text == tokenizer.decode(got.token_ids[:-1] if got.finish_reason == "stop" else got.token_ids)
            stopped += got.finish_reason == "stop"
        if options.get("num_beams", 1) > 1:
            np.testing.assert_allclose([g.score for g in mine], out.sequences_scores.numpy(), atol=1e-4)
    if options.get("early_stopping") is True:
        assert stopped  # beams reach EOS, so early stopping decides (the point of this model's EOS)


def test_sampled_sequences_are_seeded_copies(gpt2):
    predictor = gpt2[2]
    first, again = (predictor.generate(PROMPTS[1], max_new_tokens=6, temperature=0.9, seed=3, num_return_sequences=3)
                    for _ in range(2))
    assert first == again and len({g.token_ids for g in first}) > 1  # each copy draws from its own generator
    assert first[0] == predictor.generate(PROMPTS[1], max_new_tokens=6, temperature=0.9, seed=3)


@pytest.mark.parametrize("options, message", [
    ({"num_beams": 2, "temperature": 0.5}, "beam sampling is not supported"),
    ({"num_return_sequences": 2}, "greedy decoding gives one continuation"),
    ({"num_beams": 2, "num_return_sequences": 3}, "between 1 and num_beams"),
    ({"num_beams": 2, "stop": ["x"]}, "use the EOS token"),
    ({"num_beams": 2, "early_stopping": "sometimes"}, "early_stopping must be true, false or \"never\""),
    ({"num_beams": 17}, "num_beams must be between 1 and 16"),
    ({"repetition_penalty": 0}, "repetition_penalty must be above 0"),
    ({"temperature": 0.5, "num_return_sequences": 17}, "num_return_sequences must be between 1 and 16"),
])
def test_bad_decoding_options_are_refused_by_name(gpt2, options, message):
    with pytest.raises(UsageError, match=message):
        gpt2[2].generate(PROMPTS[1], max_new_tokens=4, **options)
