"""The base of tasks that decode token by token on a KV cache (optimum keeps ``OnnxConfigWithPast`` apart from
``OnnxConfig`` for the same reason): what differs for them is said here once, as overrides of TaskSpec's hooks,
so no code outside tasks/ asks whether a task generates.

- ``scheduling = DECODE``: kiln serve runs a continuous-batching step loop for it, kiln bench times first-token
  and per-token latency (both look it up in their own registries);
- only decoder-only families load for it, and no pad token is invented (prompts are left-padded per batch);
- ``predict`` is ``generate``; weight-only int8 is built by default (each step reads every weight);
- Triton's one-pass ensembles cannot hold its step loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kiln.choices import Scheduling
from kiln.errors import UnsupportedModelError
from kiln.tasks.base import TaskSpec

if TYPE_CHECKING:
    from kiln.runtime.predictor import Predictor


class GenerativeTask(TaskSpec):
    scheduling = Scheduling.DECODE
    decoders = True

    @classmethod
    def check_architecture(cls, model_type: str, decoder: bool, decoder_families: Sequence[str]) -> None:
        if not decoder:
            raise UnsupportedModelError(f"task {cls.name} needs a decoder-only language model "
                                        f"({', '.join(decoder_families)}); {model_type!r} is a bidirectional encoder")

    def predict(self, predictor: Predictor, inputs: Sequence[Any], **options: Any) -> list[Any]:
        return self.generate(predictor, inputs, **options)

    def generate(self, predictor: Predictor, prompts: Any, **options: Any) -> Any:
        """Continuations of ``prompts``; up to ``predictor.batch_size`` decode together, a finished one's place
        goes to the next. One stepper holds the cache, so concurrent calls take turns (``predictor.generating``)."""
        from kiln.decoder.chat import is_conversation, prompt_texts
        from kiln.decoder.generate import beam_generate, collect, draft_generate, prompt_ids, sample_many, stream

        single = isinstance(prompts, str) or is_conversation(prompts)  # a conversation is one prompt
        texts, chat = prompt_texts(self.config.chat, [prompts] if single else list(prompts))
        opts = self.options(**options)
        ids = prompt_ids(predictor, texts, opts.stops.max_new_tokens, special_tokens=not chat)
        steps, decode = predictor.engine.steps, predictor.encoder.decode
        with predictor.generating:
            if opts.draft is not None:
                results = draft_generate(predictor, opts.draft, ids, opts)
            elif opts.beams.active:
                results = beam_generate(steps, ids, opts.beams, opts.stops, decode, opts.sampling.repetition_penalty)
            elif opts.num_return_sequences > 1:
                results = sample_many(steps, predictor.encoder.pad_id, ids, opts, decode, predictor.batch_size)
            else:
                events = stream(steps, predictor.encoder.pad_id, ids, opts.sampling, opts.stops, decode,
                                batch_size=predictor.batch_size, logprobs=opts.logprobs)
                results = collect(events, [len(i) for i in ids])
        return results[0] if single else results
