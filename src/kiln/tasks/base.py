"""The task spec: what kiln's compute knows about one task, owned by that task's ``task`` module.

A spec class says how the task's model is loaded (auto class, settings read from the model directory),
exported (output names and which have a sequence axis), fed (pre-processing, parity, agreement,
calibration and timing inputs) and judged (agreement with the original, the gate's floors, the task metric,
the eval-file fields). How it is served (routes, request models, Triton tensors) is its wire part
(kiln.tasks.wire.base.TaskWire), which nothing below the servers imports. An instance, built from a
:class:`TaskConfig`, does the per-call work: ``options`` -> ``prepare`` (tokenize) -> engine -> ``reduce`` (per
batch) -> ``finalize``.
Nothing outside ``kiln.tasks`` branches on a task's name; it asks the spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from tokenizers import Encoding

from kiln.choices import Scheduling
from kiln.data import corpus
from kiln.data.texts import builtin_sentences, length_mix
from kiln.errors import UnsupportedModelError, UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Floor, Run
from kiln.records.task import TaskConfig
from kiln.runtime.features import Prepared, one_per_input
from kiln.tasks.export import TaskExport
from kiln.tasks.files import rows_csv, rows_jsonl
from kiln.tasks.inputs import RerankQuery

if TYPE_CHECKING:
    from kiln.records.timing import Timing
    from kiln.runtime.predictor import Predictor
    from kiln.runtime.tokenization import TextEncoder


NO_LABEL = -100  # a training target's "no label here" (padding, special tokens, a word's later sub-tokens)


class TaskSpec:
    """Base class of every task. Class attributes and class methods describe the task; instances run it."""

    name: ClassVar[str]
    export: ClassVar[type[TaskExport]]  # how the model is loaded and becomes a graph (kiln.tasks.export)
    embeds: ClassVar[bool] = False  # results are one vector per input (Predictor.encode works)
    ranks: ClassVar[bool] = False  # inputs are a query and texts, results the texts best first (Predictor.rerank)
    multi_vectors: ClassVar[bool] = False  # a text's result is one vector per kept token (late interaction)
    # How requests run: one pass per input, or token by token (GenerativeTask). Servers and benchmarks look their
    # scheduler and timing up by it in their own registries; nothing outside tasks/ asks what kind a task is.
    scheduling: ClassVar[Scheduling] = Scheduling.BATCH
    decoders: ClassVar[bool] = False  # decoder-only families (GPT-2, GPT-Neo) are verified for this task
    default_tolerance: ClassVar[float]
    tolerance_help: ClassVar[str]  # what the tolerance bounds, for `kiln optimize --help`
    metric: ClassVar[str]  # the task metric's primary score
    metric_higher_is_better: ClassVar[bool] = True
    eval_fields: ClassVar[tuple[str, ...]]  # JSONL keys / CSV columns of an eval file
    # Whether results read the tokens' character offsets (spans, labels per word); without, tokenization skips them.
    needs_offsets: ClassVar[bool] = True
    eval_formats: ClassVar[tuple[str, ...]] = (".jsonl", ".csv")
    has_builtin_eval: ClassVar[bool] = False  # whether builtin_eval() returns data (read only when used)

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
        ``decoder_families``: the decoder-only model types kiln supports, for the message."""
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
        return self.finalize(prepared, predictor.run_features(prepared.encodings), opts, predictor.encoder)

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

    # -- live agreement (kiln serve --shadow-rate) ---------------------------------------------------------
    # The figure one served input gets against the fp32 reference, and which statistic of the rolling window the
    # gate floor holds: the least (a cosine) or the mean (a share of labels kept: one flipped label makes the
    # least 0). Cosine of the comparable outputs unless the task says what its gate measures per input.
    live_figure: ClassVar[str] = "cosine"
    live_judged: ClassVar[str] = "min"

    def live_agreement(self, served: Any, reference: Any) -> float:
        from kiln.scoring import cosine

        return cosine(self.comparable(served), self.comparable(reference))

    @classmethod
    def agreement_inputs(cls, encoder: TextEncoder, count: int = 128) -> list[Any]:
        """Inputs the variants are compared on: every built-in sentence, then lengths up to the maximum cut
        from the held-out half of Python's documentation (text the default calibration never saw)."""
        extra = length_mix(max(0, count - len(builtin_sentences())), 10, encoder.max_length, seed=2,
                           token_count=encoder.token_count, source=corpus.sentences("held-out"))
        return [*builtin_sentences(), *extra]

    @classmethod
    def calibration_inputs(cls, encoder: TextEncoder, count: int = 128) -> list[Any]:
        """Default int8 calibration: the other half of Python's documentation, 10 tokens to the maximum."""
        return length_mix(count, 10, encoder.max_length, seed=1, token_count=encoder.token_count,
                          source=corpus.sentences("calibration"))

    @classmethod
    def timing_inputs(cls, encoder: TextEncoder, count: int = 256) -> list[Any]:
        """The realistic mix variants are timed on: 10-200 tokens, uniform."""
        return length_mix(count, 10, min(200, encoder.max_length), seed=3, token_count=encoder.token_count)

    @classmethod
    def inputs_from_lines(cls, lines: list[str], flag: str) -> list[Any]:
        """Inputs from a plain text file, one per line (--calibration .txt, bench --texts)."""
        return lines

    @classmethod
    def sample_input(cls, text: str) -> Any:
        """One input built from a text (a warm-up call)."""
        return text

    # -- training (kiln distill) ---------------------------------------------------------------------------
    @classmethod
    def training_rows(cls, data: EvalSet) -> tuple[list[Any], list[Any]]:
        """(model inputs, labels) to train on from a labelled file in the eval format (``--train``)."""
        return list(data.inputs), list(data.labels)

    @classmethod
    def training_labels(cls, prepared: Prepared, labels: Sequence[Any], config: TaskConfig,
                        encoder: TextEncoder) -> dict[str, list[np.ndarray]]:
        """Targets for cross-entropy from labelled rows (``--train``): output name -> one array of class
        indices per feature (-100 where a position has no label). ``labels[i]`` is None for an unlabelled
        input (the teacher alone is its target)."""
        raise UsageError(f"labelled rows (--train) cannot train a {cls.name} student yet: pass the texts with "
                         "--texts and the teacher labels them")

    # -- validation ---------------------------------------------------------------------------------------
    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        """How closely ``variant`` reproduces the original's outputs on the agreement inputs."""
        raise NotImplementedError

    @classmethod
    def floors(cls, agreement: Agreement, tolerance: float) -> list[Floor]:
        """Figures the gate checks: by default the primary agreement figure >= 1 - tolerance."""
        return [Floor(agreement.primary, agreement.value, 1.0 - tolerance)]

    @classmethod
    def metric_loss(cls, metric: float, reference: float) -> float:
        """How much worse a variant's task metric is than the original's (the gate allows up to the tolerance)."""
        return reference - metric

    @classmethod
    def parse_row(cls, row: Mapping[str, Any], where: str) -> tuple[Any, Any]:
        """(model input, gold label) from one eval-file row; errors name ``where`` and the field."""
        raise NotImplementedError

    @classmethod
    def read_eval(cls, path: Path) -> EvalSet:
        """An eval file of this task: JSONL or CSV rows with ``eval_fields``."""
        suffix = path.suffix.lower()
        if suffix not in (".jsonl", ".csv"):
            raise UsageError(f"eval_file file {path}: unsupported format {suffix or '(none)'} for {cls.name} "
                             f"(use {', '.join(cls.eval_formats)} with fields {', '.join(cls.eval_fields)})")
        rows = rows_jsonl(path) if suffix == ".jsonl" else rows_csv(path)
        parsed = [cls.parse_row(row, f"{path} line {number}") for number, row in rows]
        return EvalSet(cls.name, str(path), tuple(p[0] for p in parsed), tuple(p[1] for p in parsed))

    @classmethod
    def builtin_eval(cls) -> EvalSet | None:
        """Labelled data kiln ships for this task (None: the task metric needs --eval)."""
        return None

    def output_vectors(self, predictor: Predictor, inputs: Sequence[Any]) -> np.ndarray:
        """The output calibration (kiln.runtime.precision): the reference's vectors of ``inputs``, one row each."""
        return np.stack(predictor.predict(inputs)).astype(np.float32)

    @classmethod
    def retrieval_judgements(cls, data: EvalSet) -> Any:
        """Labelled data as retrieval judgements (kiln.validation.stored_vectors.Judgements) for the stored-vector
        table's NDCG@10; None where the task's labels are not relevance."""
        return None

    @classmethod
    def evaluate(cls, predictor: Predictor, data: EvalSet) -> dict[str, float]:
        """Score ``predictor`` on ``data``; ``metric`` names the primary score."""
        raise NotImplementedError

    @classmethod
    def builtin_metric_of(cls, agreement: Agreement) -> dict[str, float] | None:
        """The built-in task metric where the agreement run already measures it (None: ``evaluate`` the built-in
        eval set in a pass of its own)."""
        return None

    @classmethod
    def eval_inputs(cls, data: EvalSet) -> list[Any]:
        """Model inputs from labelled data, to calibrate or time on."""
        return list(data.inputs)


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


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def valid_rows(array: np.ndarray, attention_mask: np.ndarray) -> list[np.ndarray]:
    """Split a padded [batch, seq, …] array into per-row arrays cut to each row's real length."""
    lengths = attention_mask.sum(axis=1).astype(int)
    return [array[i, : lengths[i]] for i in range(array.shape[0])]
