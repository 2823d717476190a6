"""The task spec: a task's runtime, owned by its folder's ``task`` module, and the names of its other parts.

A spec class says how its inputs are checked and tokenized and how a batch's raw outputs become results
(``options`` -> ``prepare`` -> engine -> ``reduce`` per batch -> ``finalize``); an instance, built from a
:class:`TaskConfig`, does that per-call work. It names the task's export part (``export``: how the model loads and
becomes a graph, kiln.tasks.export) and validation part (``validation``: how a variant is judged,
kiln.tasks.validation); its wire part (routes, request models, Triton tensors) is found beside it by the servers
(kiln.tasks.wire).
Nothing outside ``kiln.tasks`` branches on a task's name; it asks the spec and its parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from tokenizers import Encoding

from kiln.choices import Scheduling
from kiln.errors import UnsupportedModelError, UsageError
from kiln.records.task import TaskConfig
from kiln.runtime.features import Prepared, one_per_input
from kiln.tasks.export import TaskExport
from kiln.tasks.inputs import RerankQuery
from kiln.tasks.validation import TaskValidation

if TYPE_CHECKING:
    from kiln.records.timing import Timing
    from kiln.runtime.predictor import Predictor
    from kiln.runtime.tokenization import TextEncoder




class TaskSpec:
    """Base class of every task. Class attributes and class methods describe the task; instances run it."""

    name: ClassVar[str]
    export: ClassVar[type[TaskExport]]  # how the model is loaded and becomes a graph (kiln.tasks.export)
    validation: ClassVar[type[TaskValidation]]  # how a variant is judged against the original (kiln.tasks.validation)
    embeds: ClassVar[bool] = False  # results are one vector per input (Predictor.encode works)
    ranks: ClassVar[bool] = False  # inputs are a query and texts, results the texts best first (Predictor.rerank)
    multi_vectors: ClassVar[bool] = False  # a text's result is one vector per kept token (late interaction)
    # How requests run: one pass per input, or token by token (GenerativeTask). Servers and benchmarks look their
    # scheduler and timing up by it in their own registries; nothing outside tasks/ asks what kind a task is.
    scheduling: ClassVar[Scheduling] = Scheduling.BATCH
    decoders: ClassVar[bool] = False  # decoder-only families (GPT-2, GPT-Neo) are verified for this task
    # Whether results read the tokens' character offsets (spans, labels per word); without, tokenization skips them.
    needs_offsets: ClassVar[bool] = True

    def __init__(self, config: TaskConfig) -> None:
        self.config = config
        # The artifact's output calibration vectors (set by the predictor): embedding tasks take int8/uint8 output
        # ranges from them. None where the artifact has none.
        self.output_calibration: np.ndarray | None = None
        # kiln optimize's retrieval verdicts per stored (size, precision) (kiln.records.artifact.StoredVectors)
        self.stored_vectors: tuple[Any, ...] = ()

    # -- loading ------------------------------------------------------------------------------------------
    @classmethod
    def check_architecture(cls, model_type: str, decoder: bool, decoder_families: Sequence[str]) -> None:
        """Refuse a model family this task is not verified for (a decoder-only family where ``decoders`` is False).
        ``decoder_families``: the decoder-only model types kiln generates with, for the message."""
        if decoder and not cls.decoders:
            tasks = ", ".join(t.name for t in task_classes() if t.decoders)
            raise UnsupportedModelError(f"task {cls.name} is not verified for the decoder {model_type!r}; it "
                                        f"does: {tasks}")

    @classmethod
    def time(cls, predictor: Predictor, encodings: Sequence[Encoding], *, rounds: int = 2) -> Timing:
        """How kiln optimize times a variant and the reference on the timing inputs: length-sorted batches."""
        from kiln.runtime.timing import time_sorted_batches

        return time_sorted_batches(predictor, encodings, rounds=rounds)

    @classmethod
    def adapt_engine(cls, engine: Any, config: TaskConfig) -> Any:
        """The engine as the predictor runs batches on it (a decoder's cache graph is teacher-forced)."""
        return engine

    def graph_feed(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every input of the exported graph from a collated batch (a decoder adds positions and an empty past)."""
        return arrays

    # -- per call -----------------------------------------------------------------------------------------
    def predict(self, predictor: Predictor, inputs: Sequence[Any], **options: Any) -> list[Any]:
        """``Predictor.predict``: pre-process, run length-sorted batches, post-process."""
        opts = self.options(**options)
        prepared = predictor.prepare(inputs, opts)
        tokens = self.token_outputs(opts)
        if tokens:
            self.check_token_engine(predictor.engine)
        reduced = predictor.run_features(prepared.encodings, tokens=tokens)
        return self.finalize(prepared, reduced, opts, predictor.encoder)

    def generate(self, predictor: Predictor, prompts: Any, **options: Any) -> Any:
        """``Predictor.generate``: only a GenerativeTask continues prompts."""
        generating = ", ".join(t.name for t in task_classes() if t.scheduling is Scheduling.DECODE)
        raise UsageError(f"generate() needs a decoder artifact (kiln optimize --task {generating}); this one does "
                         f"{self.name}: use predict()")

    def rerank(self, predictor: Predictor, query: str, texts: Sequence[str], **options: Any) -> list[Any]:
        """``Predictor.rerank``: a ranking task (``ranks``) orders ``texts`` for ``query``; others refuse."""
        if not self.ranks:
            ranking = ", ".join(t.name for t in task_classes() if t.ranks)
            raise UsageError(f"rerank() needs a reranker artifact (kiln optimize --task {ranking}); this one does "
                             f"{self.name}: use predict()")
        if isinstance(texts, str):
            raise UsageError("rerank() takes the texts as a list of strings (got one string)")
        return predictor.predict([RerankQuery(query, tuple(texts))], **options)[0]

    def options(self, **kwargs: Any) -> Any:
        """Validate per-call options (top_k, aggregation, …) into a frozen options object."""
        raise NotImplementedError

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        """The inputs as this task takes them, or a UsageError naming what it accepts."""
        for i, item in enumerate(inputs):
            if not isinstance(item, str):
                raise UsageError(f"{self.name} inputs must be strings (input {i} is {type(item).__name__})")
        return list(inputs)

    def prepare(self, inputs: Sequence[Any], encoder: TextEncoder, options: Any) -> Prepared:
        """Tokenize inputs into features (one per input unless the task windows them)."""
        return one_per_input(inputs, encoder.encode(inputs, truncate=options.truncate, offsets=self.needs_offsets))

    def features(self, inputs: Sequence[Any], encoder: TextEncoder, options: Any = None) -> Prepared:
        """``check_inputs`` then ``prepare`` (default options): what every caller with inputs and a tokenizer needs."""
        return self.prepare(self.check_inputs(inputs), encoder, options or self.options())

    def token_outputs(self, options: Any) -> bool:
        """Whether a call with ``options`` asks for each input's per-token vectors instead of its reduced output
        (TEI's /embed_all, sentence-transformers' ``output_value="token_embeddings"``)."""
        return False

    def check_token_engine(self, engine: Any) -> None:
        """Refuse per-token vectors an engine cannot give (before its batch runs, where the error would fail every
        request sharing it)."""

    def token_states(self, outputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Each row's per-token vectors from one batch's raw outputs: only a task that answers them says how."""
        raise UsageError(f"{self.name} answers no per-token vectors")

    def run_token_batch(self, engine: Any, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One collated batch through ``engine``: each row's per-token vectors (``token_states``)."""
        return self.token_states(engine.run(arrays), arrays)

    def run_batch(self, engine: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
        """One collated batch through ``engine``, reduced: one value per row."""
        return self.reduce_arrays(engine.run(arrays), arrays)

    def reduce_arrays(self, outputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> list[Any]:
        """``reduce`` given the whole collated batch: a task whose real positions are not its attention mask
        (ColBERT's unattended query expansion) reads the input ids too."""
        return self.reduce(outputs, arrays["attention_mask"])

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[Any]:
        """Turn one padded batch of raw outputs into one value per row (pooled vector, logits…)."""
        raise NotImplementedError

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: Any, encoder: TextEncoder) -> list[Any]:
        """Combine the reduced features of each input into its result."""
        raise NotImplementedError

    # True where finalize is a few array operations per feature, no per-token Python (a pooled vector, a row of
    # logits): kiln serve then runs it on the event loop for small requests, where handing it to a worker thread
    # would cost more than the work (kiln.serving.inference).
    light_finalize: ClassVar[bool] = False

    def comparable(self, reduced: Any) -> np.ndarray:
        """A flat float vector for one feature, used by parity checks."""
        return np.asarray(reduced, dtype=np.float32).reshape(-1)


    @classmethod
    def inputs_from_lines(cls, lines: list[str], flag: str) -> list[Any]:
        """Inputs from a plain text file, one per line (--calibration .txt, bench --texts)."""
        return lines

    @classmethod
    def sample_input(cls, text: str) -> Any:
        """One input built from a text (a warm-up call)."""
        return text

    def output_vectors(self, predictor: Predictor, inputs: Sequence[Any]) -> np.ndarray:
        """The output calibration (kiln.runtime.precision): the reference's vectors of ``inputs``, one row each."""
        return np.stack(predictor.predict(inputs)).astype(np.float32)


def task_classes() -> list[type[TaskSpec]]:
    """Every concrete task class defined so far (those with a name), for messages that list them. Read from the
    class hierarchy rather than the registry, which imports every task module (and so this one)."""
    found, todo = [], list(TaskSpec.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if "name" in vars(cls):
            found.append(cls)
    return found


