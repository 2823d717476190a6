"""Offline generation: prompts in, continuations out, on one decoding batch (``Predictor.generate``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

from kiln.decoder.batch import DecodeBatch, Decoding, Emitted, new_sequence
from kiln.decoder.beam import Beams, Hypothesis, beam_search
from kiln.decoder.logprobs import TokenLogprob
from kiln.decoder.sampling import Sampling
from kiln.decoder.speculative import speculative_greedy
from kiln.decoder.steps import Stepper
from kiln.decoder.stopping import Detokenizer, Stops
from kiln.errors import UsageError


@dataclass(frozen=True)
class Generated:
    """One prompt's continuation."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "length": max_new_tokens reached; "stop": EOS or a stop string
    prompt_tokens: int
    score: float | None = None  # beam search: the sum of log-probabilities / length ** length_penalty
    logprobs: tuple[TokenLogprob, ...] | None = None  # per generated token, when asked for


@dataclass(frozen=True)
class Budget:
    """How long a prompt may be: the model's window, less the tokens asked for."""

    window: int

    def check(self, prompt_tokens: int, max_new_tokens: int, index: int = 0) -> None:
        if max_new_tokens >= self.window:
            raise UsageError(f"max_new_tokens must be below the model's window of {self.window} tokens "
                             f"(got {max_new_tokens})")
        if prompt_tokens + max_new_tokens > self.window:
            raise UsageError(f"prompt {index} has {prompt_tokens} tokens; with max_new_tokens {max_new_tokens} it "
                             f"passes the model's window of {self.window} tokens")
        if prompt_tokens == 0:
            raise UsageError(f"prompt {index} encodes to no tokens")


def prompt_ids(predictor: Any, prompts: Sequence[str], max_new_tokens: int, *,
               special_tokens: bool = True) -> list[list[int]]:
    """Token ids of each prompt, refused (UsageError) when it and ``max_new_tokens`` would pass the window.
    ``special_tokens`` False: none added (rendered chat templates hold their own)."""
    prepared = predictor.prepare(prompts, predictor.handler.options(max_new_tokens=max_new_tokens, truncate=False,
                                                                    special_tokens=special_tokens))
    budget = Budget(predictor.encoder.max_length)
    for i, enc in enumerate(prepared.encodings):
        budget.check(len(enc.ids), max_new_tokens, i)
    return [list(enc.ids) for enc in prepared.encodings]


def stream(steps: Stepper, pad_id: int, prompts: Sequence[Sequence[int]], sampling: Sampling | Sequence[Sampling],
           stops: Stops, decode, *, batch_size: int = 16, logprobs: int | None = None
           ) -> Iterator[tuple[int, Emitted]]:
    """(prompt index, what it produced) per step: up to ``batch_size`` prompts decode together and a finished
    one's place goes to the next waiting prompt (the same continuous batching the server does). ``sampling``:
    one for every prompt, or one each."""
    samplings = [sampling] * len(prompts) if isinstance(sampling, Sampling) else list(sampling)
    if batch_size < 1:
        raise UsageError(f"batch_size must be at least 1 (got {batch_size})")
    batch = DecodeBatch(steps, pad_id)
    waiting = list(enumerate(prompts))
    while waiting or len(batch):
        room = batch_size - len(batch)
        if waiting and room > 0:  # joiners prefill in one call and get their first token; the others wait a round
            joining, waiting = waiting[:room], waiting[room:]
            emitted = batch.add([new_sequence(p, samplings[i], stops, decode, owner=i, logprobs=logprobs)
                                 for i, p in joining])
        else:
            emitted = batch.step()
        for e in emitted:
            yield e.sequence.owner, e
        batch.remove([e.sequence for e in emitted if e.finished])


def collect(events: Iterator[tuple[int, Emitted]], prompt_lengths: Sequence[int]) -> list[Generated]:
    """The finished continuations of ``stream``'s events, in prompt order."""
    done = {i: generated_of(e.sequence, prompt_lengths[i]) for i, e in events if e.finished}
    return [done[i] for i in range(len(prompt_lengths))]


def generated_of(sequence: Decoding, prompt_tokens: int) -> Generated:
    """A finished sequence's continuation (its EOS, when it stopped at one, among the token ids, not the text)."""
    text = sequence.text
    logprobs = tuple(sequence.chosen) if sequence.logprobs is not None else None
    return Generated(text.text, text.token_ids, str(text.finish_reason), prompt_tokens, logprobs=logprobs)


def beam_generate(steps: Stepper, prompts: Sequence[Sequence[int]], beams: Beams, stops: Stops, decode,
                  repetition_penalty: float = 1.0) -> list[Any]:
    """Beam search per prompt (kiln.decoder.beam): its best continuation, or with num_return_sequences > 1 the list
    of the best, best first."""
    results = []
    for prompt in prompts:
        found = [from_hypothesis(h, stops, decode, len(prompt)) for h in
                 beam_search(steps, prompt, beams, stops.max_new_tokens, stops.eos_ids, repetition_penalty)]
        results.append(found if beams.num_return_sequences > 1 else found[0])
    return results


def sample_many(steps: Stepper, pad_id: int, prompts: Sequence[Sequence[int]], options: Any, decode,
                batch_size: int) -> list[list[Generated]]:
    """num_return_sequences independent samples per prompt: each copy of a prompt draws from its own generator
    (seed + k for the k-th copy when a seed is given), all decoding in the same continuous batch."""
    count = options.num_return_sequences
    copies = [p for p in prompts for _ in range(count)]
    samplings = [s for _ in prompts for s in copies_of(options.sampling, count)]
    events = stream(steps, pad_id, copies, samplings, options.stops, decode, batch_size=batch_size,
                    logprobs=options.logprobs)
    flat = collect(events, [len(p) for p in copies])
    return [flat[i * count : (i + 1) * count] for i in range(len(prompts))]


def draft_generate(predictor: Any, draft: Any, prompts: Sequence[Sequence[int]], options: Any) -> list[Generated]:
    """Greedy continuations found with a draft model's guesses (kiln.decoder.speculative): the same text as greedy
    decoding without it. The draft must be a decoder with the target's tokenizer (its ids must mean the same)."""
    if getattr(draft, "engine", None) is None or not hasattr(draft.engine, "new_stepper"):
        raise UsageError("draft: pass a decoder's predictor (kiln.load of a decoder artifact)")
    if draft.encoder.tokenizer.get_vocab(True) != predictor.encoder.tokenizer.get_vocab(True):
        raise UsageError("draft: its tokenizer differs from the model's; speculative decoding compares token ids, so "
                         "the draft must share the model's tokenizer (kiln distill --layers K keeps it)")
    longest = max(len(p) for p in prompts) + options.stops.max_new_tokens
    if longest > draft.encoder.max_length:
        raise UsageError(f"draft: its window of {draft.encoder.max_length} tokens is shorter than the longest prompt "
                         f"with max_new_tokens ({longest})")
    results = []
    draft_steps = draft.engine.new_stepper()  # its own: the draft may be the model itself (OpenVINO's requests)
    with draft.generating if draft is not predictor else nullcontext():  # the caller holds the model's lock
        for prompt in prompts:
            tokens = speculative_greedy(predictor.engine.steps, draft_steps, prompt,
                                        options.stops.max_new_tokens, options.stops.eos_ids, options.draft_tokens)
            results.append(detokenized(tokens, options.stops, predictor.encoder.decode, len(prompt)))
    return results


def detokenized(tokens: Sequence[int], stops: Stops, decode, prompt_tokens: int) -> Generated:
    """The text of generated ``tokens`` as streaming would show it: ending at an EOS or a stop string."""
    text = Detokenizer(decode, stops)
    for token in tokens:
        text.add(token)
        if text.finish_reason:
            break
    return Generated(text.text, text.token_ids, str(text.finish_reason), prompt_tokens)


def copies_of(sampling: Sampling, count: int) -> list[Sampling]:
    """``count`` independent samplers: the k-th draws with seed + k when a seed is given."""
    return [replace(sampling, seed=None if sampling.seed is None else sampling.seed + k) for k in range(count)]


def from_hypothesis(found: Hypothesis, stops: Stops, decode, prompt_tokens: int) -> Generated:
    ended = bool(found.tokens) and found.tokens[-1] in stops.eos_ids
    text_ids = found.tokens[:-1] if ended else found.tokens
    return Generated(decode(list(text_ids)), found.tokens, "stop" if ended else "length", prompt_tokens,
                     found.score)
