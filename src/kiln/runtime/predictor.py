"""The predictor: task pre-processing, length-sorted batches through an engine, task post-processing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from tokenizers import Encoding

from kiln.engines.base import Engine
from kiln.errors import UsageError
from kiln.runtime.batch_plan import RUN_TOKENS, input_batches, length_batches
from kiln.runtime.features import Prepared, TaskRuntime
from kiln.runtime.tokenization import TextEncoder
from kiln.system.memory import trim_heap

TRIM_AFTER_S = 1.0  # a pass of sessions side by side longer than this hands freed heap pages back (trim_heap)


class Predictor:
    """Runs a task end to end on one engine. Inputs are grouped by length so batches carry little padding.

    Thread-safe: ``predict``/``encode``/``rerank`` may be called from several threads at once (the engines run
    concurrent calls: ONNX Runtime and torch natively, OpenVINO on spare infer requests). ``generate`` carries a
    decoder's KV cache in one stepper, so concurrent generate calls on one predictor take turns (a lock);
    for concurrent decoding use ``kiln serve``, which batches sequences from many clients into shared steps.
    """

    def __init__(self, task: TaskRuntime, encoder: TextEncoder, engine: Engine, *, batch_size: int = 32,
                 sessions: Sequence[Engine] = (), solo: Engine | None = None, pad_multiple: int | None = None,
                 output_calibration: np.ndarray | None = None, stored_vectors: tuple[Any, ...] = ()):
        """``task``: the task's per-call part for this model (``kiln.tasks.task_handler(config)``); the predictor owns
        it from here on. ``sessions``: further sessions of the same engine; batches then run side by side, one per
        session (what ``kiln bench``'s sweep measured as sessions x threads); ``solo``: with several sessions, one
        more session of more threads that runs a call's lone batch (one text should not wait on one core while the
        others idle). ``pad_multiple``: batches are padded to a multiple of this length (default: the engine's own).
        ``output_calibration``: the artifact's calibration vectors, which int8/uint8 output precision takes its
        ranges from (kiln.runtime.precision);
        ``stored_vectors``: kiln optimize's retrieval verdicts per (size, precision), rejected ones refused."""
        if batch_size < 1:
            raise UsageError(f"batch_size must be at least 1 (got {batch_size})")
        if pad_multiple is not None and pad_multiple < 1:
            raise UsageError(f"pad_multiple must be at least 1 (got {pad_multiple})")
        self.config = task.config
        self.encoder = encoder
        self.handler = task
        self.output_calibration, self.stored_vectors = output_calibration, tuple(stored_vectors)
        self.handler.output_calibration, self.handler.stored_vectors = output_calibration, self.stored_vectors
        # As given; ``engine`` and ``sessions`` are the task's view of them (a decoder's graph, teacher-forced).
        self.raw_engine, self._raw_sessions, self._raw_solo = engine, tuple(sessions), solo
        self.engine = task.adapt_engine(engine, self.config)
        self.sessions = (self.engine, *(task.adapt_engine(s, self.config) for s in sessions))
        self.solo = task.adapt_engine(solo, self.config) if solo is not None and sessions else None
        self.batch_size = batch_size
        self._pad_multiple = pad_multiple
        self.generating = threading.Lock()  # held while a decoder's stepper runs a generate() call

    @property
    def pad_multiple(self) -> int:
        """Batches are padded to a multiple of this many tokens."""
        return self._pad_multiple or getattr(self.engine, "pad_multiple", 1)

    @property
    def run_tokens(self) -> int:
        """What one engine run costs beyond its padded tokens, in tokens (the engine's own, else the length
        plan's default): how finely sorted inputs are cut into batches."""
        return getattr(self.engine, "run_tokens", RUN_TOKENS)

    def predict(self, inputs: Sequence[Any], **options: Any) -> list[Any]:
        """One result per input, in input order (see the task modules for result types; a decoder generates)."""
        return self.handler.predict(self, inputs, **options)

    def prepare(self, inputs: Sequence[Any], options: Any = None) -> Prepared:
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or not len(inputs):
            raise UsageError("inputs must be a non-empty list")
        return self.handler.features(inputs, self.encoder, options)

    def encode(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """sentence-transformers' ``encode`` (same arguments, shapes, dtypes) for an embedding artifact."""
        from kiln.runtime.encode import encode

        return encode(self, sentences, **kwargs)

    def encode_query(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """``encode`` with the model's ``query`` prompt unless one is given (sentence-transformers 5)."""
        from kiln.runtime.encode import QUERY_PROMPTS, encode_role

        return encode_role(self, sentences, QUERY_PROMPTS, **kwargs)

    def encode_document(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """``encode`` with the model's ``document`` (or ``passage``, ``corpus``) prompt unless one is given."""
        from kiln.runtime.encode import DOCUMENT_PROMPTS, encode_role

        return encode_role(self, sentences, DOCUMENT_PROMPTS, **kwargs)

    @property
    def similarity_fn_name(self) -> str:
        """The model's similarity function (config_sentence_transformers.json), cosine where it names none."""
        from kiln.runtime.similarity import COSINE

        return self.config.similarity_fn_name or COSINE

    def similarity(self, embeddings1: Any, embeddings2: Any) -> Any:
        """[len(embeddings1), len(embeddings2)] scores under ``similarity_fn_name`` (sentence-transformers')."""
        from kiln.runtime.similarity import similarity

        return similarity(self.similarity_fn_name, embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> Any:
        """The score of each embeddings1[i] with embeddings2[i] under ``similarity_fn_name``."""
        from kiln.runtime.similarity import similarity_pairwise

        return similarity_pairwise(self.similarity_fn_name, embeddings1, embeddings2)

    def get_sentence_embedding_dimension(self) -> int | None:
        """The size of ``encode``'s vectors (None: not an embedding artifact)."""
        return self.config.dimension if self.handler.embeds else None

    get_embedding_dimension = get_sentence_embedding_dimension  # sentence-transformers 6's name

    @property
    def max_seq_length(self) -> int:
        """Tokens past which a text is cut (special tokens included)."""
        return self.config.max_length

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer: a ``tokenizers.Tokenizer`` (kiln runs without transformers), cutting at
        ``max_seq_length``."""
        return self.encoder.tokenizer

    @property
    def prompts(self) -> dict[str, str]:
        """The model's named prompts (config_sentence_transformers.json), beside an empty ``query`` and
        ``document`` where it defines none, as sentence-transformers 6 holds them."""
        from kiln.runtime.encode import role_prompts

        return role_prompts(self)

    @property
    def default_prompt_name(self) -> str | None:
        return self.config.default_prompt_name

    def rerank(self, query: str, texts: Sequence[str], **options: Any) -> list[Any]:
        """The texts ranked for ``query``, best first, as :class:`kiln.Ranked` (index into ``texts``, score, and
        the text with ``return_documents=True``); ``top_n``, ``raw_scores`` as the /rerank route takes them."""
        return self.handler.rerank(self, query, texts, **options)

    def generate(self, prompts: str | Sequence[str], **options: Any) -> Any:
        """Continuations of ``prompts`` (a decoder artifact): :class:`kiln.Generated` per prompt (one for a string).
        Options: ``max_new_tokens`` (32), ``temperature`` (0: greedy), ``top_k``, ``top_p``, ``seed``, ``stop``.
        Up to ``batch_size`` prompts decode together; a finished one's place goes to the next."""
        return self.handler.generate(self, prompts, **options)

    def with_batch_size(self, batch_size: int) -> Predictor:
        """The same tokenizer and engine, batching ``batch_size`` features at a time."""
        return Predictor(type(self.handler)(self.config), self.encoder, self.raw_engine, batch_size=batch_size,
                         sessions=self._raw_sessions,
                         solo=self._raw_solo, pad_multiple=self._pad_multiple,
                         output_calibration=self.output_calibration, stored_vectors=self.stored_vectors)

    def run_features(self, encodings: Sequence[Encoding], *, sort: bool = True, tokens: bool = False) -> list[Any]:
        """Reduced outputs per encoding, in the given order; batches are formed by length when ``sort``. ``tokens``:
        each encoding's per-token vectors instead (the task's ``token_states``)."""
        reduced: list[Any] = [None] * len(encodings)
        for i, value in self.iter_features(encodings, sort=sort, tokens=tokens):
            reduced[i] = value
        return reduced

    def iter_features(self, encodings: Sequence[Encoding], *, sort: bool = True, tokens: bool = False
                      ) -> Iterator[tuple[int, Any]]:
        """``run_features``' values as each batch gives them: (index in ``encodings``, reduced output); batches of
        at most ``batch_size``."""
        # sorted: by length, cut where padding costs more than another run (kiln.runtime.batch_plan)
        groups = (length_batches([len(e.ids) for e in encodings], self.batch_size, self.pad_multiple, self.run_tokens)
                  if sort else input_batches(len(encodings), self.batch_size))
        batches = [self.encoder.collate([encodings[i] for i in idx], multiple=self.pad_multiple) for idx in groups]
        for idx, values in zip(groups, self._run(batches, tokens)):
            yield from zip((int(i) for i in idx), values)

    def _run(self, batches: list[dict[str, np.ndarray]], tokens: bool = False) -> Iterable[list[Any]]:
        """Each batch's reduced values (``tokens``: per-token vectors), in order."""
        run_batch = self.handler.run_token_batch if tokens else self.handler.run_batch
        if len(self.sessions) == 1 or len(batches) == 1:
            # One batch at a time, reduced before the next runs (a decoder's logits are 0.5 GB a batch of 32 on
            # GPT-2 small; a list held every batch's raw outputs at once). A lone batch beside idle sessions runs
            # on the solo session's threads where there is one.
            engine = self.solo if self.solo is not None and len(batches) == 1 else self.engine
            return (run_batch(engine, b) for b in batches)
        from concurrent.futures import ThreadPoolExecutor

        # Session k takes every k-th batch: sorted batches grow in length, so each gets a like share of work.
        count = len(self.sessions)
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=count) as pool:
            parts = list(pool.map(lambda k: [run_batch(self.sessions[k], b) for b in batches[k::count]], range(count)))
        if time.perf_counter() - start > TRIM_AFTER_S:
            # Each session's thread frees its batches' buffers into its own glibc arena, which keeps them: two
            # OpenVINO streams held 944 MiB after a pass of 1,024 texts, 564 once trimmed (one stream: 538, 398).
            # The trim took 13-20 ms, so only after passes long enough for it not to count.
            trim_heap()
        results: list[list[Any]] = [[]] * len(batches)
        for k, part in enumerate(parts):
            results[k::count] = part
        return results
