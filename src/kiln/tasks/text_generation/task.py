"""Text generation with a decoder-only model (GPT-2, GPT-Neo, Llama, Qwen3) and its KV cache.

The exported graph is one decoding step (:mod:`kiln.decoder.graph`): token ids, mask, positions and the past
keys/values in, logits and the grown keys/values out. Validation runs real text teacher-forced through that step
(a prefill, then one token at a time on the returned cache) and compares every position's logits with the
original's plain forward pass. Agreement: next-token (argmax) agreement (gate >= 1 - t) and logit cosine (mean
gate >= 1 - t/2); task metric: perplexity on held-out text (lower is better: the gate allows a relative rise
of t). Routes: POST /generate and the OpenAI-compatible POST /v1/completions, both with optional streaming,
served by a continuous-batching step loop (:mod:`kiln.serving.generation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.decoder.beam import Beams
from kiln.decoder.graph import (
    LOGITS_AT,
    SEQLENS_K,
    TOTAL_LENGTH,
    CacheShape,
    positions,
)
from kiln.decoder.logprobs import MAX_LOGPROBS
from kiln.decoder.sampling import Sampling
from kiln.decoder.speculative import check_draft_tokens
from kiln.decoder.stopping import Stops
from kiln.decoder.teacher import TeacherForced
from kiln.errors import UsageError
from kiln.runtime.features import Prepared, one_per_input
from kiln.tasks.generative import GenerativeTask
from kiln.tasks.text_generation.export import TextGenerationExport
from kiln.tasks.text_generation.validation import TextGenerationValidation

MAX_STOPS = 4  # stop strings per request, as OpenAI allows
MAX_RETURN_SEQUENCES = 16  # continuations per prompt
# kiln optimize times a decoder by generating: each timing text a prompt continued by this many greedy tokens, this
# many prompts decoding together (kiln bench's latency cells are batches of 1 and 4).
TIMING_NEW_TOKENS = 16
TIMING_BATCH = 4
LONG_PASS_S = 20.0  # a timing pass this long is not repeated
OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "repetition_penalty", "num_beams",
           "length_penalty", "early_stopping", "num_return_sequences", "logprobs", "draft", "draft_tokens",
           "special_tokens")


@dataclass(frozen=True)
class GenerationOptions:
    sampling: Sampling
    stops: Stops
    truncate: bool = True  # text is cut to the window for validation; prompts never are (generate refuses them)
    beams: Beams = Beams()  # num_beams 1: no beam search
    num_return_sequences: int = 1  # continuations per prompt (beam search's best, or independent samples)
    logprobs: int | None = None  # None: none reported; n: each chosen token's log-probability and the n best
    draft: Any = None  # a draft decoder's Predictor: speculative greedy decoding (kiln.decoder.speculative)
    draft_tokens: int = 4  # tokens the draft proposes per target step
    special_tokens: bool = True  # False: the prompts hold their own (a rendered chat template)


class TextGeneration(GenerativeTask):
    validation = TextGenerationValidation
    export = TextGenerationExport
    name = "text-generation"

    @classmethod
    def adapt_engine(cls, engine: Any, config: Any) -> Any:
        """A KV-cache graph's engine, seen as a plain forward pass for validation (see kiln.decoder.teacher)."""
        shape = cache_shape(config)
        if shape.past_names()[0] in engine.input_names:
            return TeacherForced(engine, shape, trim=not getattr(engine, "holds_memory", True))
        return engine

    def graph_feed(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A right-padded batch as one first step on an empty cache, for the exported graph (mask and positions)
        and the fused one (each row's length - 1 and the longest; callers feed each graph the inputs it has)."""
        mask = arrays["attention_mask"]
        batch = mask.shape[0]
        return {**arrays, "position_ids": positions(mask, mask.shape[1]), **cache_shape(self.config).empty(batch),
                SEQLENS_K: (mask.sum(axis=1) - 1).astype(np.int32), TOTAL_LENGTH: np.array(mask.shape[1], np.int32),
                LOGITS_AT: np.broadcast_to(np.arange(mask.shape[1]), mask.shape).copy()}

    # -- per call -----------------------------------------------------------------------------------------
    def options(self, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int | None = None,
                top_p: float = 1.0, seed: int | None = None, stop: Sequence[str] = (), truncate: bool = True,
                repetition_penalty: float = 1.0, num_beams: int = 1, length_penalty: float = 1.0,
                early_stopping: bool | str = False, num_return_sequences: int = 1, logprobs: int | None = None,
                draft: Any = None, draft_tokens: int = 4, special_tokens: bool = True,
                **unknown: Any) -> GenerationOptions:
        if unknown:
            raise UsageError(f"unknown generation option(s) {', '.join(sorted(unknown))}; use {', '.join(OPTIONS)}")
        if isinstance(stop, str):
            stop = (stop,)
        sampling = Sampling(temperature, top_k, top_p, seed, repetition_penalty)
        beams = Beams(num_beams, length_penalty, early_stopping, num_return_sequences if num_beams > 1 else 1)
        if beams.active and not sampling.greedy:
            raise UsageError("num_beams > 1 searches with temperature 0 (beam search); beam sampling is not "
                             "supported: set temperature 0, or num_beams 1 to sample")
        if beams.active and stop:
            raise UsageError("stop strings end a text as it streams; with num_beams > 1 use the EOS token and "
                             "max_new_tokens")
        if num_return_sequences > 1 and not beams.active and sampling.greedy:
            raise UsageError("greedy decoding gives one continuation: num_return_sequences > 1 needs num_beams > 1 "
                             "or temperature > 0")
        if not 1 <= num_return_sequences <= MAX_RETURN_SEQUENCES:
            raise UsageError(f"num_return_sequences must be between 1 and {MAX_RETURN_SEQUENCES} "
                             f"(got {num_return_sequences})")
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise UsageError(f"logprobs must be between 0 and {MAX_LOGPROBS} (got {logprobs})")
        if logprobs is not None and beams.active:
            raise UsageError("logprobs are reported per chosen token of a sampled or greedy decoding; with "
                             "num_beams > 1 the beams' scores are the search's figure: set num_beams 1 or drop "
                             "logprobs")
        if draft is not None:
            check_draft_tokens(draft_tokens)
            refused = [name for name, used in (("temperature > 0", not sampling.greedy),
                                               ("num_beams > 1", beams.active),
                                               ("repetition_penalty", repetition_penalty != 1.0),
                                               ("logprobs", logprobs is not None)) if used]
            if refused:
                raise UsageError(f"a draft model speeds up greedy decoding and keeps its output; it does not combine "
                                 f"with {', '.join(refused)}")
        return GenerationOptions(sampling, Stops(max_new_tokens, frozenset(self.config.eos_ids), tuple(stop)),
                                 truncate, beams, num_return_sequences, logprobs, draft, draft_tokens, special_tokens)

    def prepare(self, inputs: Sequence[Any], encoder, options: Any) -> Prepared:
        """Prompts are never truncated (the window check refuses one too long); teacher-forced text is."""
        return one_per_input(inputs, encoder.encode(inputs, truncate=options.truncate,
                                                     special_tokens=options.special_tokens))

    def run_batch(self, engine: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
        """A KV-cache graph's teacher-forced logits are written straight into each row's real positions
        (TeacherForced.run_rows): the padded batch is never held."""
        if isinstance(engine, TeacherForced):
            return engine.run_rows(arrays)
        return super().run_batch(engine, arrays)

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[Any]:
        """Per row: the logits of its real positions (fp32: parity needs them exact; a 50k vocabulary x 128 tokens
        is 26 MB a row, which is why agreement and perplexity run on a few dozen texts)."""
        logits = outputs["logits"]
        lengths = attention_mask.sum(axis=1).astype(int)
        return [np.array(logits[i, : lengths[i]], dtype=np.float32) for i in range(logits.shape[0])]

    def finalize(self, prepared, reduced, options, encoder) -> list[Any]:
        return list(reduced)

    @classmethod
    def time(cls, predictor, encodings, *, rounds: int = 2):
        """Generation, as ``generate()`` and kiln serve run it: each timing text is a prompt continued by
        ``TIMING_NEW_TOKENS`` greedy tokens, ``TIMING_BATCH`` decoding together, prompts by length. Timing the
        teacher-forced batches validation runs instead kept every position's logits of 32 rows (4.1 GB peak on
        GPT-2 small's OpenVINO variant, `python benchmarks/optimize_profile.py`, 2-core AMX Xeon) and timed work no
        user asks for."""
        from kiln.decoder.timing import time_generation
        from kiln.records.timing import Timing

        if not isinstance(predictor.engine, TeacherForced):  # a graph without a cache: its forward pass is the work
            return super().time(predictor, encodings, rounds=rounds)
        room = max(1, predictor.encoder.max_length - TIMING_NEW_TOKENS)  # prompt and continuation fit the window
        prompts = sorted(([t for t, m in zip(e.ids, e.attention_mask) if m][:room] for e in encodings), key=len)

        def once(chosen: list[list[int]], new_tokens: int) -> float:
            # A stepper of the pass's own, as each teacher-forced call has (its runtime memory goes with it).
            return time_generation(predictor.engine.new_stepper(), predictor.encoder.pad_id, chosen,
                                   batch_size=TIMING_BATCH, new_tokens=new_tokens, decode=predictor.encoder.decode)

        once(prompts[:TIMING_BATCH], 2)  # lazy initialisation is not timed
        passes = [once(prompts, TIMING_NEW_TOKENS)]
        # A pass as long as LONG_PASS_S already averages out the machine's drift, which the second pass is there
        # for: on Qwen3-0.6B's shape PyTorch's pass alone took ~90 s (2-core AVX2 EPYC), a minute of kiln optimize
        # per variant for the second.
        while len(passes) < rounds and passes[0] < LONG_PASS_S:
            passes.append(once(prompts, TIMING_NEW_TOKENS))
        return Timing(len(prompts), min(passes), TIMING_BATCH, TIMING_NEW_TOKENS)


def cache_shape(config: Any) -> CacheShape:
    return CacheShape(int(config.cache["layers"]), int(config.cache["heads"]), int(config.cache["head_size"]))
