"""text-generation's validation part: next-token agreement and logit cosine under teacher forcing, greedy
continuations compared token for token; perplexity as the task metric."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.data import corpus
from kiln.data.texts import length_mix
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, Continuations, EvalSet, Floor, Run
from kiln.scoring import greedy_figures
from kiln.system.memory import trim_heap
from kiln.tasks.files import field
from kiln.tasks.validation import TaskValidation

if TYPE_CHECKING:
    from kiln.runtime.predictor import Predictor
    from kiln.runtime.tokenization import TextEncoder

# Greedy continuations the gate compares: CONTINUATION_PROMPTS held-out prompts of 16 to 64 tokens, each continued
# by up to CONTINUATION_TOKENS tokens. Next-token agreement under teacher forcing misses what a user reads: on the
# Llama trained by benchmarks/decoder_fidelity.py, openvino-int4-weights kept 0.952 of next tokens and 0.579 of the
# original's greedy text (RESULTS.md, Decoders).
CONTINUATION_PROMPTS, CONTINUATION_TOKENS = 16, 32


def greedy_agreement(original: Sequence[Sequence[int]], variant: Sequence[Sequence[int]]) -> dict[str, float]:
    """The share of the original's greedy tokens a variant reproduces before its first different token (a
    continuation that differs once goes on from another text, so nothing after the difference counts), and the
    share of prompts continued identically."""
    kept = [next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            for ours, theirs in zip(original, variant)]
    return greedy_figures(kept, [len(o) for o in original],
                          [tuple(ours) == tuple(theirs) for ours, theirs in zip(original, variant)])


def _next_token_nll(logits: np.ndarray, ids: Sequence[int]) -> tuple[float, int]:
    """The summed negative log-likelihood of each next token of ``ids`` under ``logits`` (one row per position),
    and how many tokens it scored."""
    if len(ids) < 2:
        return 0.0, 0
    x = np.asarray(logits[: len(ids) - 1], np.float64)
    log_z = x.max(-1) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1))
    return float((log_z - x[np.arange(len(x)), np.asarray(ids[1:])]).sum()), len(x)


class TextGenerationValidation(TaskValidation):
    name = "text-generation"
    default_tolerance = 0.05
    tolerance_help = ("next-token agreement >= 1 - t and mean logit cosine >= 1 - t/2 against the original over "
                      "held-out text, the share of its greedy continuations' tokens kept before the first "
                      "difference >= 1 - 2t, and perplexity at most (1 + t) x the original's")
    metric = "perplexity"
    metric_higher_is_better = False
    eval_fields = ("text",)
    has_builtin_eval = True
    # Its outputs are logits at every position: a batch of 32 texts of 128 tokens over Qwen3's 151,936-token
    # vocabulary is a 2.5 GB tensor, which with the model took the reference run to 6.4 GB; batches of 4, 311 MB.
    reference_batch = 4

    @classmethod
    def agreement_inputs(cls, encoder, count: int = 32) -> list[Any]:
        """Held-out documentation text of 16 tokens up to 128 (or the window): teacher-forced logits at every
        position are compared, a few thousand next-token decisions."""
        return length_mix(count, 16, min(128, encoder.max_length), seed=2, token_count=encoder.token_count,
                          source=corpus.sentences("held-out"))

    @classmethod
    def calibration_inputs(cls, encoder, count: int = 64) -> list[Any]:
        return length_mix(count, 16, min(256, encoder.max_length), seed=1, token_count=encoder.token_count,
                          source=corpus.sentences("calibration"))

    @classmethod
    def timing_inputs(cls, encoder, count: int = 32) -> list[Any]:
        """32 prompts of 16 to 128 tokens, each continued by ``TIMING_NEW_TOKENS`` in ``time``: optimize ranks its
        variants on them (kiln bench measures first-token and per-token latency by prompt length)."""
        return length_mix(count, 16, min(128, encoder.max_length), seed=3, token_count=encoder.token_count)

    @classmethod
    def continuation_prompts(cls, encoder: TextEncoder) -> list[str]:
        """Held-out prompts (another draw than the agreement texts') short enough that prompt and continuation fit
        the model's window."""
        longest = max(16, min(64, encoder.max_length - CONTINUATION_TOKENS))
        return length_mix(CONTINUATION_PROMPTS, min(16, longest), longest, seed=4, token_count=encoder.token_count,
                          source=corpus.sentences("held-out"))

    @classmethod
    def reference_continuations(cls, generator: Callable[[], Predictor]) -> Continuations:
        original = generator()
        prompts = tuple(cls.continuation_prompts(original.encoder))
        made = original.generate(list(prompts), max_new_tokens=CONTINUATION_TOKENS)
        return Continuations(prompts, tuple(tuple(g.token_ids) for g in made))

    @classmethod
    def with_generation(cls, agreement: Agreement, data: AgreementInputs, candidate: Predictor) -> Agreement:
        if data.continuations is None:
            return agreement
        made = candidate.generate(list(data.continuations.prompts), max_new_tokens=CONTINUATION_TOKENS)
        figures = greedy_agreement(data.continuations.tokens, [g.token_ids for g in made])
        return dataclasses.replace(agreement, figures={**agreement.figures, **figures})

    # -- validation ---------------------------------------------------------------------------------------
    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        per_text, top1, cosines = [], [], []
        nll, count = 0.0, 0
        for enc, ref, got in zip(data.prepared.encodings, data.reference.reduced, variant.reduced):
            a, b = np.asarray(ref, np.float32), np.asarray(got, np.float32)
            same = a.argmax(-1) == b.argmax(-1)
            cos = (a * b).sum(-1) / np.clip(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12, None)
            per_text.append(float(same.mean()))
            top1.append(same)
            cosines.append(cos)
            text_nll, scored = _next_token_nll(b, enc.ids)
            nll, count = nll + text_nll, count + scored
            # Each text's temporaries are ~100 MB over a 50k vocabulary, and glibc kept the freed blocks: GPT-2
            # small's 32 agreement texts left 0.9 GB resident under the engine (benchmarks/optimize_profile.py).
            trim_heap()
        same, cos = np.concatenate(top1), np.concatenate(cosines)
        figures = {"next_token_agreement": float(same.mean()), "mean_logit_cosine": float(cos.mean()),
                   "min_logit_cosine": float(cos.min()), "positions": float(same.size),
                   # The variant's own perplexity on the agreement texts: the built-in task metric, for free.
                   "perplexity": float(np.exp(nll / max(count, 1))), "perplexity_tokens": float(count)}
        return Agreement.of("next_token_agreement", figures, data.lengths(), np.array(per_text),
                            "next-token agreement")

    @classmethod
    def builtin_metric_of(cls, agreement: Agreement) -> dict[str, float] | None:
        """Perplexity on the agreement texts (held-out documentation, teacher-forced through the cache), taken from
        the logits the agreement run already holds: a pass of its own over other held-out text cost GPT-2 small
        ~80 s on PyTorch and ~120 s per ONNX variant on 2 cores (benchmarks/optimize_profile.py)."""
        return {"perplexity": agreement.figures["perplexity"], "tokens": agreement.figures["perplexity_tokens"]}

    @classmethod
    def floors(cls, agreement: Agreement, tolerance: float) -> list[Floor]:
        floors = [Floor("next_token_agreement", agreement.figures["next_token_agreement"], 1.0 - tolerance),
                  Floor("mean_logit_cosine", agreement.figures["mean_logit_cosine"], 1.0 - tolerance / 2)]
        if "greedy_agreement" in agreement.figures:  # where the original's continuations were made (optimize's gate)
            # 1 - 2t: one token changed halfway through one of the 16 continuations keeps 0.97 of their text, one
            # changed at the first token of two of them 0.88 (on the trained Llama of RESULTS.md: int8 weights
            # 1.0, every int4 scheme 0.57-0.67, onnx-int8-dynamic 0.74)
            floors.append(Floor("greedy_agreement", agreement.figures["greedy_agreement"], 1.0 - 2 * tolerance,
                                stated=True))
        return floors

    @classmethod
    def metric_loss(cls, metric: float, reference: float) -> float:
        """Perplexity's relative rise over the original's."""
        return metric / reference - 1.0

    @classmethod
    def parse_row(cls, row: Mapping[str, Any], where: str) -> tuple[Any, Any]:
        return field(row, "text", where), None

    @classmethod
    def read_eval(cls, path: Path) -> EvalSet:
        if path.suffix.lower() == ".txt":  # plain text: one passage per non-blank line
            lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
            if not lines:
                raise UsageError(f"eval_file file {path} holds no text")
            return EvalSet(cls.name, str(path), tuple(lines), (None,) * len(lines))
        return super().read_eval(path)

    eval_formats = (".jsonl", ".csv", ".txt")

    @classmethod
    def builtin_eval(cls) -> EvalSet:
        """The agreement texts: their perplexity comes with every agreement run (``builtin_metric_of``)."""
        return EvalSet(cls.name, "the agreement texts (held-out Python documentation)", (), (), builtin=True)

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        """Perplexity: exp of the mean negative log-likelihood of every next token, teacher-forced."""
        if not data.inputs:  # the built-in set has no texts of its own: its figure is builtin_metric_of's
            raise UsageError(f"no texts to measure perplexity on in {data.source}")
        prepared = predictor.prepare(list(data.inputs), predictor.handler.options(truncate=True))
        nll, count = 0.0, 0
        # Bounded memory: 8 rows of logits at a time (GPT-2's 50k vocabulary x 300 tokens is 60 MB a row, held
        # three times over while a teacher-forced batch is assembled and cut into rows).
        for start in range(0, len(prepared.encodings), 8):
            encodings = prepared.encodings[start : start + 8]
            for enc, logits in zip(encodings, predictor.run_features(encodings)):
                text_nll, scored = _next_token_nll(logits, enc.ids)
                nll, count = nll + text_nll, count + scored
        return {"perplexity": float(np.exp(nll / max(count, 1))), "tokens": float(count)}
