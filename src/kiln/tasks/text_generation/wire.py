"""text-generation on the wire: POST /generate and the OpenAI-compatible POST /v1/completions and
/v1/chat/completions (answered by kiln.serving.generation), and kiln.pipeline's text-generation call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kiln.choices import WireProtocol
from kiln.decoder.beam import MAX_BEAMS
from kiln.decoder.chat import is_conversation
from kiln.decoder.logprobs import MAX_LOGPROBS
from kiln.errors import UsageError
from kiln.tasks.text_generation.task import (
    MAX_RETURN_SEQUENCES,
    MAX_STOPS,
    TextGeneration,
)
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import NonBlank, ResponseModel, Route

# -- HTTP ---------------------------------------------------------------------------------------------------
Stop = NonBlank | list[NonBlank]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = Field(None, description="Which served model; default: the only (or first) one.")
    temperature: float = Field(0.0, ge=0, le=100, description="0: greedy; above 0: sampling at that temperature.")
    top_k: int | None = Field(None, ge=1, le=1_000_000, description="Sample among the k most likely tokens.")
    top_p: float = Field(1.0, gt=0, le=1, description="Sample among the most likely tokens holding this mass.")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Same seed, prompt and model: same tokens.")
    stop: Stop | None = Field(None, description=f"Up to {MAX_STOPS} strings; the text ends before the first.")
    repetition_penalty: float = Field(1.0, gt=0, le=100, description="transformers' (and vLLM's) repetition "
                                      "penalty: a token already in the text has its logit divided by it (multiplied "
                                      "when negative); 1: none.")
    num_beams: int = Field(1, ge=1, le=MAX_BEAMS, description="Beam search over this many beams (temperature 0, "
                           "no stop strings, no streaming), as transformers' generate; 1: none.")
    length_penalty: float = Field(1.0, ge=-10, le=10, description="Beam search: a finished beam scores its summed "
                                  "log-probability / length ** length_penalty.")
    early_stopping: bool | Literal["never"] = Field(False, description="Beam search: true ends when num_beams "
                                                    "beams have finished; false or \"never\" as transformers'.")
    stream: bool = Field(False, description="Server-sent events, one per generated piece of text.")

    def stops(self) -> tuple[str, ...]:
        stops = () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if len(stops) > MAX_STOPS:
            raise UsageError(f"stop: at most {MAX_STOPS} strings (got {len(stops)})")
        return stops

    def prompts(self) -> list[str]:
        raise NotImplementedError

    def new_tokens(self) -> int:
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        return {"max_new_tokens": self.new_tokens(), "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "seed": self.seed, "stop": self.stops(),
                "repetition_penalty": self.repetition_penalty, "num_beams": self.num_beams,
                "length_penalty": self.length_penalty, "early_stopping": self.early_stopping}

    def input_count(self) -> int:
        return len(self.prompts())

    def choices(self, n: int, logprobs: int | None) -> dict[str, Any]:
        """The options of OpenAI's ``n`` choices per prompt and their log-probabilities, checked together."""
        if n > 1 and self.num_beams == 1 and self.temperature == 0:
            raise UsageError("n > 1 needs temperature > 0 (independent samples) or num_beams >= n (the n best "
                             "beams): greedy decoding gives one continuation")
        if n > self.num_beams > 1:
            raise UsageError(f"n must be at most num_beams ({self.num_beams}) with beam search (got {n})")
        return {"num_return_sequences": n, "logprobs": logprobs}


class GenerateRequest(_Body):
    inputs: NonBlank = Field(description="The prompt.")
    max_new_tokens: int = Field(32, ge=1, le=1_000_000, description="At most this many tokens (prompt + these "
                                "must fit the model's window; 422 otherwise).")

    def prompts(self) -> list[str]:
        return [self.inputs]

    def new_tokens(self) -> int:
        return self.max_new_tokens


class CompletionRequest(_Body):
    """OpenAI's /v1/completions body (the fields kiln honours; others are refused, not ignored)."""

    model: str = Field(description="The served model's name (any name when one model is served).")
    prompt: NonBlank | list[NonBlank] = Field(description="A prompt or a list of prompts.")
    max_tokens: int = Field(16, ge=1, le=1_000_000, description="At most this many tokens per prompt.")
    temperature: float = Field(1.0, ge=0, le=2, description="0: greedy; above 0: sampling at that temperature.")
    n: int = Field(1, ge=1, le=MAX_RETURN_SEQUENCES, description="Choices per prompt: independent samples (seed + k "
                   "for the k-th when seeded), or with num_beams the n best beams (n <= num_beams).")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="Per chosen token its log-probability "
                                 "under the model (raw logits, before penalty and temperature) and this many most "
                                 "likely alternatives; not with num_beams > 1.")

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def options(self) -> dict[str, Any]:
        return {**super().options(), **self.choices(self.n, self.logprobs)}

    def new_tokens(self) -> int:
        return self.max_tokens


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"] = Field(description="Only text parts: kiln's decoders read text.")
    text: str


class ChatMessage(BaseModel):
    """One message of a conversation, as OpenAI's chat API sends it (text content only)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] = Field(description="The message's text, or its text parts (joined).")
    name: str | None = Field(None, description="Passed to the chat template as the message's name.")

    def as_dict(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": self.role, "content": content, **({"name": self.name} if self.name is not None else {})}


class ChatCompletionRequest(_Body):
    """OpenAI's /v1/chat/completions body (the fields kiln honours; others are refused, not ignored). The
    conversation is rendered with the model's own chat template (as transformers' ``apply_chat_template`` renders
    it, the assistant's turn opened) and continued."""

    model: str = Field(description="The served model's name (any name when one model is served).")
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000, description="The conversation so far.")
    max_tokens: int | None = Field(None, ge=1, le=1_000_000, description="At most this many tokens (older name of "
                                   "max_completion_tokens); neither: up to the model's window.")
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000, description="At most this many tokens; "
                                              "neither this nor max_tokens: up to the model's window.")
    temperature: float = Field(1.0, ge=0, le=2, description="0: greedy; above 0: sampling at that temperature.")
    n: int = Field(1, ge=1, le=MAX_RETURN_SEQUENCES, description="Choices: independent samples (seed + k for the "
                   "k-th when seeded), or with num_beams the n best beams (n <= num_beams).")
    logprobs: bool = Field(False, description="Each chosen token's log-probability under the model (raw logits, "
                           "before penalty and temperature); not with num_beams > 1.")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="With logprobs: this many most likely "
                                     "alternatives per token.")

    def prompts(self) -> list[Any]:
        return [[m.as_dict() for m in self.messages]]

    def input_count(self) -> int:
        return 1

    def new_tokens(self) -> int | None:
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise UsageError(f"max_tokens and max_completion_tokens differ ({self.max_tokens} and "
                             f"{self.max_completion_tokens}); send one of them")
        return self.max_completion_tokens or self.max_tokens

    def options(self) -> dict[str, Any]:
        if self.top_logprobs is not None and not self.logprobs:
            raise UsageError("top_logprobs needs logprobs: true")
        return {**super().options(), **self.choices(self.n, (self.top_logprobs or 0) if self.logprobs else None)}


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class GenerateResponse(ResponseModel):
    model: str
    generated_text: str
    finish_reason: Literal["length", "stop", "cancelled"]
    usage: Usage


class CompletionLogprobs(ResponseModel):
    """OpenAI's completion log-probabilities: per token its text, log-probability, best alternatives, and where
    its text starts in the completion."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(ResponseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["length", "stop"] | None


class CompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatTopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(ResponseModel):
    content: list[ChatTokenLogprob]


class AssistantMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(ResponseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["length", "stop"] | None


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


def _no_render(body: Any, model: str, prepared: Any, results: list[Any]) -> dict[str, Any]:
    raise NotImplementedError("generation routes are answered by kiln.serving.generation")


class TextGenerationPipeline:
    """transformers' text-generation pipeline call, on a kiln predictor: ``pipe("Once upon", max_new_tokens=20)``
    -> ``[{"generated_text": "Once upon a time..."}]``; a list of prompts gives one such list per prompt.

    As in transformers: greedy unless ``do_sample=True`` (then ``temperature`` 1.0, ``top_k`` 50, ``top_p`` 1.0 unless
    given), ``return_full_text`` (default True) puts the prompt in front, ``stop_strings`` end the text. kiln adds
    ``seed`` (transformers draws from torch's global generator). Beam search (``num_beams``, ``length_penalty``,
    ``early_stopping``) and ``num_return_sequences`` (one dict each, best first) as transformers'. A conversation (a
    list of ``{"role", "content"}`` messages) is rendered with the model's chat template and answered as
    transformers answers it: the messages with the assistant's reply appended.
    """

    task = "text-generation"
    _SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}  # transformers' GenerationConfig defaults

    def __init__(self, predictor, **defaults: Any) -> None:
        self.predictor = predictor
        self.defaults = defaults

    def __call__(self, text_inputs: str | Sequence[str], **kwargs: Any) -> Any:
        options = {**self.defaults, **kwargs}
        full = options.pop("return_full_text", True)
        sample = options.pop("do_sample", False)
        if "stop_strings" in options:
            options["stop"] = options.pop("stop_strings")
        if sample:
            options = {**self._SAMPLING_DEFAULTS, **options}
        else:
            options = {k: v for k, v in options.items() if k not in self._SAMPLING_DEFAULTS}
        single = isinstance(text_inputs, str) or is_conversation(text_inputs)
        prompts = [text_inputs] if single else list(text_inputs)
        if not all(isinstance(p, str) or is_conversation(p) for p in prompts):
            raise UsageError("text-generation takes a prompt string, a conversation (a list of {role, content} "
                             "messages) or a list of either")
        results = self.predictor.generate(prompts, **options)

        def answer(prompt: Any, text: str) -> Any:  # a conversation comes back with the assistant's reply added
            if not isinstance(prompt, str):
                return [*prompt, {"role": "assistant", "content": text}] if full else text
            return prompt + text if full else text

        shaped = [[{"generated_text": answer(p, r.text)} for r in (rs if isinstance(rs, list) else [rs])]
                  for p, rs in zip(prompts, results)]
        return shaped[0] if single else shaped


class TextGenerationWire(TaskWire):
    task = TextGeneration
    routes = (
        Route("/generate", "Generate a continuation (optionally streamed as server-sent events)", GenerateRequest,
              GenerateResponse, _no_render, inputs_field="inputs", kind="generate"),
        Route("/v1/completions", "OpenAI-compatible completions (optionally streamed)", CompletionRequest,
              CompletionResponse, _no_render, any_model_name=True, inputs_field="prompt", kind="generate",
              protocol=WireProtocol.OPENAI),
        # One conversation per request: no field is a list of inputs (messages are one input's parts).
        Route("/v1/chat/completions", "OpenAI-compatible chat completions in the model's chat template (optionally "
              "streamed)", ChatCompletionRequest, ChatCompletionResponse, _no_render, any_model_name=True,
              inputs_field="", kind="generate", protocol=WireProtocol.OPENAI),
    )
    pipeline = TextGenerationPipeline

    @classmethod
    def triton_refusal(cls) -> str | None:
        return (f"kiln triton writes one-pass ensembles; {cls.task.name} decodes step by step with a KV cache: serve "
                "it with kiln serve (continuous batching, /v1/completions)")


WIRE = TextGenerationWire
