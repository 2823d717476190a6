"""multi-vector's validation part: MaxSim rankings per query kept, judged as a reranker's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Judgements, Run
from kiln.scoring import maxsim
from kiln.tasks.rerank.validation import TOP, RerankValidation, rank_agreement
from kiln.tasks.validation import TaskValidation


def kept_vectors(late: Mapping[str, Any], feature: Any, vectors: np.ndarray) -> np.ndarray:
    """A feature's token vectors as PyLate returns them: a query's every position (its real tokens alone without
    expansion), a document's real tokens less the skiplist. ``late``: the model's late-interaction settings."""
    ids = np.asarray(feature.ids)
    vectors = vectors[: len(ids)]
    if feature.is_query:
        return vectors if late["do_query_expansion"] else vectors[np.asarray(feature.attention_mask, bool)]
    return vectors[~np.isin(ids, late["skiplist_ids"])]

class MultiVectorValidation(TaskValidation):
    name = "multi-vector"
    default_tolerance = RerankValidation.default_tolerance
    tolerance_help = f"MaxSim ranks per query: mean Kendall tau >= 1-t and mean top-{TOP} overlap >= 1-t"
    metric = RerankValidation.metric
    eval_fields = RerankValidation.eval_fields

    @classmethod
    def retrieval_judgements(cls, data: EvalSet) -> Judgements | None:
        """The --eval rows (query, text, relevance) as retrieval judgements: every query searches every text."""
        return Judgements.of_pairs(data.source, ((item.query, t) for item in data.inputs for t in item.texts),
                                   (label for labels in data.labels for label in labels))

    # -- inputs: a reranker's (queries over texts), so agreement and timing exercise both encodings ---------
    agreement_inputs = RerankValidation.agreement_inputs
    calibration_inputs = RerankValidation.calibration_inputs
    timing_inputs = RerankValidation.timing_inputs
    parse_row = RerankValidation.parse_row
    read_eval = RerankValidation.read_eval
    evaluate = RerankValidation.evaluate
    eval_inputs = RerankValidation.eval_inputs
    floors = RerankValidation.floors
    # -- validation ---------------------------------------------------------------------------------------
    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        late = data.config.late_interaction
        kept = [[kept_vectors(late, f, r) for f, r in zip(data.prepared.encodings, run.reduced)]
                for run in (data.reference, variant)]
        cosines = np.concatenate([(a * b).sum(axis=1) for a, b in zip(*kept)])
        owners = np.array(data.prepared.owners)

        def scores(vectors: list[np.ndarray], query: int) -> np.ndarray:  # the query's feature first, then its texts
            mine = [vectors[j] for j in np.flatnonzero(owners == query)]
            return maxsim(mine[0], mine[1:])

        queries = range(len(data.prepared.inputs))
        tau, figures = rank_agreement((scores(kept[0], q), scores(kept[1], q)) for q in queries)
        figures |= {"mean_token_cosine": float(cosines.mean()), "min_token_cosine": float(cosines.min())}
        return Agreement.of("mean_kendall_tau", figures, data.lengths(), tau, "kendall tau")
