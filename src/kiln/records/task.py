"""The task settings an artifact carries, so serving needs neither torch nor transformers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kiln.choices import Pooling
from kiln.errors import UsageError


@dataclass(frozen=True)
class PairPrompt:
    """How a causal reranker (Qwen3-Reranker) reads a (query, document) pair: its chat template rendered with the
    pair in the ``query`` and ``document`` roles (sentence-transformers' convention), kept as the text around the
    two contents, so serving renders it without Jinja. ``suffix_ids``: the template's closing tokens, written back
    over the last ones of a pair cut to the model's maximum (the score is read at the last position)."""

    prefix: str
    between: str
    suffix: str
    suffix_ids: tuple[int, ...]
    answers: tuple[int, int]  # the "yes" and "no" token ids whose logit difference is the score

    def render(self, query: str, document: str) -> str:
        return f"{self.prefix}{query}{self.between}{document}{self.suffix}"

    def closed(self, ids: list[int]) -> list[int]:
        """The ids of a pair cut to the model's maximum with the template's closing tokens over its last ones."""
        if not self.suffix_ids:
            return ids
        return [*ids[: max(len(ids) - len(self.suffix_ids), 0)], *self.suffix_ids[-len(ids):]] if ids else ids

    def to_dict(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "between": self.between, "suffix": self.suffix,
                "suffix_ids": list(self.suffix_ids), "answers": list(self.answers)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PairPrompt:
        yes, no = (int(i) for i in raw["answers"])
        return cls(str(raw["prefix"]), str(raw["between"]), str(raw["suffix"]),
                   tuple(int(i) for i in raw["suffix_ids"]), (yes, no))


@dataclass(frozen=True)
class ChatTemplate:
    """A decoder's chat template (its tokenizer's Jinja ``chat_template``) and the special tokens' texts it reads
    (``bos_token``, ``eos_token``, ...), carried so that serving renders chats without transformers
    (kiln.decoder.chat)."""

    template: str
    tokens: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"template": self.template, "tokens": dict(self.tokens)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ChatTemplate:
        return cls(str(raw["template"]), {str(k): str(v) for k, v in raw.get("tokens", {}).items()})


@dataclass(frozen=True)
class TaskConfig:
    task: str  # a name in kiln.tasks.TASKS
    max_length: int
    pooling: Pooling = Pooling.MEAN
    normalize: bool = False
    id2label: Mapping[int, str] = field(default_factory=dict)
    problem_type: str | None = None
    dimension: int | None = None  # an embedding's size (None: not an embedding task, or an older artifact)
    # Sizes an embedding may be cut to (Matryoshka-trained models); validation reports agreement at each.
    matryoshka_dims: tuple[int, ...] = ()
    special_ids: tuple[int, ...] = ()  # the tokenizer's special tokens (sparse embeddings never weight them)
    eos_ids: tuple[int, ...] = ()  # a decoder's end-of-sequence tokens (generation stops at them)
    cache: Mapping[str, int] = field(default_factory=dict)  # a decoder's KV cache: layers, heads, head_size
    # ColBERT (multi-vector): query/document lengths, marker and expansion token ids, expansion, skiplist ids
    late_interaction: Mapping[str, Any] = field(default_factory=dict)
    # sentence-transformers' prompts (config_sentence_transformers.json): name -> the text put before an input
    # (nomic-embed's "search_query: "), and the one used when a call names none.
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    pair_prompt: PairPrompt | None = None  # a causal reranker's prompt template (None: the tokenizer's pairs)
    # sentence-transformers' similarity_fn_name (cosine, dot, euclidean, manhattan); None: it names none (cosine)
    similarity_fn_name: str | None = None
    # sentence-transformers Dense projections applied to every token state inside the graph (EmbeddingGemma): its
    # token states are not the encoder's, so no per-token vectors are answered
    projected: bool = False
    chat: ChatTemplate | None = None  # a decoder's chat template (None: the model has none; chats are refused)

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before each input, chosen as sentence-transformers chooses it: ``prompt`` itself, else the
        model's prompt named ``prompt_name``, else its default prompt, else nothing. Both at once are refused
        (sentence-transformers ignores the name then; kiln never ignores what it was asked)."""
        if prompt is not None and prompt_name is not None:
            raise UsageError(f"prompt and prompt_name: pass one of them (got {prompt!r} and {prompt_name!r})")
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return ""
        if name not in self.prompts:
            known = ", ".join(repr(n) for n in sorted(self.prompts))
            raise UsageError(f"prompt_name must be one of the model's prompts: {known} (got {name!r})" if known
                             else f"prompt_name: the model defines no prompts (got {name!r}); pass the text with "
                             "prompt")
        return self.prompts[name]

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "max_length": self.max_length, "pooling": self.pooling.value,
                "normalize": self.normalize, "id2label": {str(k): v for k, v in self.id2label.items()},
                "problem_type": self.problem_type, "dimension": self.dimension,
                "matryoshka_dims": list(self.matryoshka_dims), "special_ids": list(self.special_ids),
                "eos_ids": list(self.eos_ids), "cache": dict(self.cache),
                "late_interaction": dict(self.late_interaction), "prompts": dict(self.prompts),
                "default_prompt_name": self.default_prompt_name,
                "pair_prompt": self.pair_prompt.to_dict() if self.pair_prompt else None,
                "similarity_fn_name": self.similarity_fn_name, "projected": self.projected,
                "chat": self.chat.to_dict() if self.chat else None}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TaskConfig:
        return cls(
            task=str(raw["task"]),
            max_length=int(raw["max_length"]),
            pooling=Pooling(raw.get("pooling", "mean")),
            normalize=bool(raw.get("normalize", False)),
            id2label={int(k): v for k, v in raw.get("id2label", {}).items()},
            problem_type=raw.get("problem_type"),
            dimension=int(raw["dimension"]) if raw.get("dimension") is not None else None,
            matryoshka_dims=tuple(int(d) for d in raw.get("matryoshka_dims", ())),
            special_ids=tuple(int(i) for i in raw.get("special_ids", ())),
            eos_ids=tuple(int(i) for i in raw.get("eos_ids", ())),
            cache={str(k): int(v) for k, v in raw.get("cache", {}).items()},
            late_interaction=dict(raw.get("late_interaction", {})),
            prompts={str(k): str(v) for k, v in raw.get("prompts", {}).items()},
            default_prompt_name=raw.get("default_prompt_name"),
            pair_prompt=PairPrompt.from_dict(raw["pair_prompt"]) if raw.get("pair_prompt") else None,
            similarity_fn_name=raw.get("similarity_fn_name"),
            projected=bool(raw.get("projected", False)),
            chat=ChatTemplate.from_dict(raw["chat"]) if raw.get("chat") else None,
        )
