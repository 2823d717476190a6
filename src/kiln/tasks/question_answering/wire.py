"""question-answering on the wire: POST /answer, kiln.pipeline's question-answering call (transformers 5 has
none), and Triton's QUESTION and CONTEXT inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from kiln.errors import UsageError
from kiln.tasks.inputs import QAInput
from kiln.tasks.question_answering.task import (
    QuestionAnswering,
    as_qa_input,
)
from kiln.tasks.wire.base import TaskWire
from kiln.tasks.wire.http import Count, FormField, NonBlank, RequestBody, ResponseModel, Route, listify, render_results


class QAItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    question: NonBlank
    context: NonBlank


class AnswerRequest(RequestBody):
    inputs: QAItem | Annotated[list[QAItem], Field(min_length=1)] = Field(
        description="A {question, context} pair or a list of them.")
    top_k: Count = 1
    max_answer_len: Count = 15
    allow_null: bool = Field(False, description="SQuAD 2.0: answer \"\" when no span beats the null score.")
    null_threshold: float = Field(0.0, ge=-1.0, le=1.0)

    def items(self) -> list[Any]:
        return [QAInput(i.question, i.context) for i in listify(self.inputs)]

    def options(self) -> dict[str, Any]:
        return {"top_k": self.top_k, "max_answer_len": self.max_answer_len, "allow_null": self.allow_null,
                "null_threshold": self.null_threshold}


class AnswerModel(ResponseModel):
    answer: str
    score: float
    start: int
    end: int


class AnswerResponse(ResponseModel):
    model: str
    results: list[list[AnswerModel]]
    truncated: list[bool]


class QuestionAnsweringPipeline:
    """transformers 4's question-answering pipeline call, on a kiln predictor (transformers 5 removed it).

    ``pipe(question=..., context=...)`` or ``pipe({"question": ..., "context": ...})`` or a list of such dicts;
    ``top_k``, ``handle_impossible_answer``, ``max_answer_len``, ``doc_stride``, ``max_seq_len`` as there.
    One answer is a dict with score, start, end, answer; ``top_k > 1`` gives a list per question.
    """

    task = "question-answering"

    def __init__(self, predictor, **defaults: Any) -> None:
        self.predictor = predictor
        self.defaults = defaults

    def __call__(self, *args: Any, question: str | list[str] | None = None, context: str | list[str] | None = None,
                 top_k: int = 1, handle_impossible_answer: bool = False, max_answer_len: int = 15,
                 doc_stride: int = 128, max_seq_len: int = 384, **kwargs: Any) -> Any:
        items, single = _qa_items(args, question, context)
        options = {"top_k": top_k, "allow_null": handle_impossible_answer, "max_answer_len": max_answer_len,
                   "doc_stride": doc_stride, "max_seq_len": max_seq_len, **self.defaults, **kwargs}
        results = self.predictor.predict(items, **options)
        answers = [[{"score": a.score, "start": a.start, "end": a.end, "answer": a.answer} for a in r]
                   or [{"score": 0.0, "start": 0, "end": 0, "answer": ""}] for r in results]
        shaped = [a[0] if options["top_k"] == 1 else a for a in answers]
        return shaped[0] if single else shaped


def _qa_items(args: tuple[Any, ...], question: Any, context: Any) -> tuple[list[QAInput], bool]:
    """The pipeline's input forms: keywords (one each, or equal lists), a dict, a list of dicts, QAInput(s)."""
    if question is not None or context is not None:
        if question is None or context is None:
            raise UsageError("question-answering needs both question= and context=")
        if isinstance(question, str) and isinstance(context, str):
            return [QAInput(question, context)], True
        questions = [question] * len(context) if isinstance(question, str) else list(question)
        contexts = [context] * len(questions) if isinstance(context, str) else list(context)
        if len(questions) != len(contexts):
            raise UsageError(f"{len(questions)} questions but {len(contexts)} contexts")
        return [QAInput(q, c) for q, c in zip(questions, contexts)], False
    if len(args) != 1:
        raise UsageError("call with question= and context=, a {'question', 'context'} dict, or a list of them")
    given = args[0]
    if isinstance(given, (list, tuple)) and not (len(given) == 2 and all(isinstance(x, str) for x in given)):
        return [as_qa_input(x, i) for i, x in enumerate(given)], False
    return [as_qa_input(given)], True


class QuestionAnsweringWire(TaskWire):
    task = QuestionAnswering
    routes = (Route("/answer", "Extract answers from contexts", AnswerRequest, AnswerResponse, render_results,
                    form=(FormField("question", "Question"), FormField("context", "Context", multiline=True))),)
    pipeline = QuestionAnsweringPipeline
    triton_inputs = ("QUESTION", "CONTEXT")
    triton_windows = True  # a long context is several doc-stride windows
    @classmethod
    def triton_items(cls, columns: Mapping[str, list[str]]) -> list[Any]:
        return [QAInput(q, c) for q, c in zip(columns["QUESTION"], columns["CONTEXT"])]


WIRE = QuestionAnsweringWire
