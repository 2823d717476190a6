"""A task's validation part: how kiln judges a variant of its model against the original.

Each task folder's ``validation`` module subclasses :class:`TaskValidation`, and the task's spec names it
(``TaskSpec.validation``). It says which inputs the variants are compared, calibrated and timed on, how closely a
variant agrees with the original (and which floors the gate holds), the task metric and the eval file it reads, the
labels a student trains on, and the per-input figure ``kiln serve --shadow-rate`` keeps. It runs nothing itself:
the predictor or the runtime that makes the results is passed in, so this part imports no runtime of its task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kiln.data import corpus
from kiln.data.texts import builtin_sentences, length_mix
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, Continuations, EvalSet, Floor, Run, bucket_index
from kiln.records.task import TaskConfig
from kiln.scoring import cosine_bound
from kiln.tasks.files import rows_csv, rows_jsonl

if TYPE_CHECKING:
    from kiln.runtime.features import Prepared
    from kiln.runtime.predictor import Predictor
    from kiln.runtime.tokenization import TextEncoder
    from kiln.tasks.base import TaskSpec

NO_LABEL = -100  # a training target's "no label here" (padding, special tokens, a word's later sub-tokens)

# The margin the gate holds beyond its agreement texts' minimum: a log-normal fit of each length's cosine deficits
# must put 99.9% of texts like them at the floor (95% confidence under that model). A length bucket needs this many
# texts for a fit (fewer: its minimum alone is held).
BOUND_SHARE, BOUND_CONFIDENCE, BOUND_MIN_TEXTS = 0.999, 0.95, 8


def length_bound(cosines: np.ndarray, lengths: list[int]) -> float | None:
    """The lowest, over length buckets with enough texts, of the cosine a log-normal fit puts 99.9% of texts of that
    length at (95% confidence; :func:`kiln.scoring.cosine_bound`). Per length because short texts drift more: on
    all-MiniLM-L6-v2's onnx-int8-dynamic-rows as the gate once accepted it (3 of 24 MatMuls in fp32), 6.35% of 1,024
    unseen queries of 3-16 tokens fell below 0.99 against none of 1,024 documentation texts of 10-256 tokens
    (benchmarks/unseen_text.py), and a fit over every length hid it."""
    index = np.array([bucket_index(n) for n in lengths])
    bounds = [cosine_bound(cosines[index == b], BOUND_SHARE, BOUND_CONFIDENCE)
              for b in sorted(set(index.tolist())) if (index == b).sum() >= BOUND_MIN_TEXTS]
    return min(bounds) if bounds else None


class TaskValidation:
    """Base of every task's validation part: class attributes and class methods only."""

    name: ClassVar[str]  # the task's name (TaskSpec.name), for messages and eval sets
    default_tolerance: ClassVar[float]
    tolerance_help: ClassVar[str]  # what the tolerance bounds, for `kiln optimize --help`
    metric: ClassVar[str]  # the task metric's primary score
    metric_higher_is_better: ClassVar[bool] = True
    eval_fields: ClassVar[tuple[str, ...]]  # JSONL keys / CSV columns of an eval file
    eval_formats: ClassVar[tuple[str, ...]] = (".jsonl", ".csv")
    has_builtin_eval: ClassVar[bool] = False  # whether builtin_eval() returns data (read only when used)
    # What an accepted variant promises about texts the gate never saw, in words for the report ({floor}: the
    # primary figure's floor; {count}: the agreement inputs; {share}: the least share of inputs like them within the
    # floor, 95% confidence, when all {count} are); None where the gate states nothing beyond its agreement inputs.
    promise: ClassVar[str | None] = None
    agreement_count: ClassVar[int] = 160  # agreement inputs by default
    # The most inputs a batch of the PyTorch reference takes on the agreement set (None: the run's batch size).
    reference_batch: ClassVar[int | None] = None

    @classmethod
    def promised(cls, tolerance: float) -> str | None:
        """The promise in words for a run at ``tolerance`` (None where the task makes none)."""
        if cls.promise is None:
            return None
        # Clopper-Pearson's one-sided bound with none of n failing: 1 - 0.05^(1/n) (the "rule of three", ~3/n).
        return cls.promise.format(floor=f"{1 - tolerance:g}", count=cls.agreement_count,
                                  share=0.05 ** (1 / cls.agreement_count))

    # -- live agreement (kiln serve --shadow-rate) ---------------------------------------------------------
    # The figure one served input gets against the fp32 reference, and which statistic of the rolling window the
    # gate floor holds: the least (a cosine) or the mean (a share of labels kept: one flipped label makes the
    # least 0). Cosine of the comparable outputs unless the task says what its gate measures per input.
    live_figure: ClassVar[str] = "cosine"
    live_judged: ClassVar[str] = "min"

    @classmethod
    def live_agreement(cls, handler: TaskSpec, served: Any, reference: Any) -> float:
        """One served result's agreement with the reference's (``handler``: the task's runtime, which makes them
        comparable)."""
        from kiln.scoring import cosine

        return cosine(handler.comparable(served), handler.comparable(reference))

    # -- inputs -------------------------------------------------------------------------------------------

    @classmethod
    def agreement_inputs(cls, encoder: TextEncoder, count: int | None = None) -> list[Any]:
        """Inputs the variants are compared on: every built-in sentence, short queries of 3-16 tokens, then lengths
        up to the maximum, both cut from the held-out half of Python's documentation (text the default calibration
        never saw). A quarter of the rest are queries: short texts drift most under int8, and the built-in sentences
        alone left 9 texts of 16 tokens or fewer, too few to bound what the next query does."""
        rest = max(0, (cls.agreement_count if count is None else count) - len(builtin_sentences()))
        queries = length_mix(rest // 4, 3, min(16, encoder.max_length), seed=4, token_count=encoder.token_count,
                             source=corpus.sentences("held-out"))
        longer = length_mix(rest - len(queries), 10, encoder.max_length, seed=2, token_count=encoder.token_count,
                            source=corpus.sentences("held-out"))
        return [*builtin_sentences(), *queries, *longer]

    @classmethod
    def calibration_inputs(cls, encoder: TextEncoder, count: int = 128) -> list[Any]:
        """Default int8 calibration: the other half of Python's documentation, 10 tokens to the maximum."""
        return length_mix(count, 10, encoder.max_length, seed=1, token_count=encoder.token_count,
                          source=corpus.sentences("calibration"))

    @classmethod
    def timing_inputs(cls, encoder: TextEncoder, count: int = 256) -> list[Any]:
        """The realistic mix variants are timed on: 10-200 tokens, uniform."""
        return length_mix(count, 10, min(200, encoder.max_length), seed=3, token_count=encoder.token_count)

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
    def reference_continuations(cls, generator: Callable[[], Predictor]) -> Continuations | None:
        """The original's greedy continuations of held-out prompts (``generator`` makes the original as it
        generates), made once for :meth:`with_generation` to compare each variant's with; None for a task that does not
        generate."""
        return None

    @classmethod
    def with_generation(cls, agreement: Agreement, data: AgreementInputs, candidate: Predictor) -> Agreement:
        """``agreement`` with the figures of ``candidate``'s own continuations of ``data.continuations`` added, in
        the batching ``candidate`` runs; unchanged by default."""
        return agreement

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

