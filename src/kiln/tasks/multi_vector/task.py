"""Late interaction (ColBERT): one small L2-normalised vector per token, queries and documents encoded apart,
scored with MaxSim.

Checkpoints as PyLate and sentence-transformers store them: a BERT-family encoder, then the Dense projections of
modules.json (``1_Dense``…: linear, no activation), and config_sentence_transformers.json with the query and
document markers (``[Q] ``/``[D] ``, added tokens; the original ColBERT's ``[unused0]``/``[unused1]``),
``query_length``/``document_length``, query expansion with ``[MASK]`` up to ``query_length``
(``attend_to_expansion_tokens``: whether the encoder attends to them) and the skiplist (punctuation left out of a
document's vectors); or as the original ColBERT (``colbert-ai``) stores them: the encoder and a ``linear``
projection in one weights file, ``artifact.metadata`` for the rest (:class:`ColbertAiLayout`). The projection is
inside the exported graph, so every engine returns [batch, tokens, dim].

PyLate's encoding, in kiln:
- a query is ``[CLS] [Q] text [SEP]`` cut to ``query_length``, then ``[MASK]`` up to ``query_length``; every
  position is a vector (without expansion: the real tokens only);
- a document is ``[CLS] [D] text [SEP]`` cut to ``document_length``; its vectors leave out skiplist tokens.

Inputs: texts (documents, or queries with ``is_query=True``), or :class:`~kiln.tasks.rerank.task.RerankQuery` (a query
and texts to rank by MaxSim: what ``rerank()`` and ``POST /rerank`` send). Agreement: per query, Kendall's tau and
top-3 overlap of the variant's MaxSim scores against the original's (the gate), with every token vector's cosine
to the original's beside them. Task metric: NDCG@10 and MRR from (query, text, relevance) rows, as a reranker's.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import ModelLoadError, UnsupportedModelError, UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Judgements, Run
from kiln.runtime.features import Prepared
from kiln.runtime.precision import Precision, parse_precision, quantize, ranges_for, refuse_rejected
from kiln.runtime.tokenization import Features
from kiln.scoring import ranking
from kiln.tasks.base import TaskSpec, read_json
from kiln.tasks.rerank.task import TOP, Ranked, Rerank, as_rerank_query, rank_agreement

# Token vectors kept for the output calibration (int8/uint8 ranges): a seeded sample, so the artifact stays small
# (16k x 128 float32 = 8 MiB) while every dimension's extremes come from tens of thousands of candidates.
CALIBRATION_VECTORS = 16384
DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32, "document_length": 180,
            "do_query_expansion": True, "attend_to_expansion_tokens": False}  # PyLate's, where the config is silent


def stacked(documents: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Documents' token vectors as one [all tokens, dim] array, and where each document starts in it."""
    lengths = np.array([len(d) for d in documents])
    if (lengths == 0).any():
        raise UsageError("a document with no token vectors cannot be scored (every token was skipped)")
    return np.concatenate(documents), np.concatenate([[0], np.cumsum(lengths)[:-1]])


def maxsim_stacked(query: np.ndarray, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """MaxSim of one query against stacked documents (:func:`stacked`): one matrix product, a segmented max."""
    sims = tokens @ query.T  # [all document tokens, query tokens]
    return np.maximum.reduceat(sims, starts, axis=0).sum(axis=1).astype(np.float32)


def maxsim(query: np.ndarray, documents: Sequence[np.ndarray]) -> np.ndarray:
    """ColBERT's late-interaction score of one query against each document: the sum over the query's vectors of
    their best dot product with any of the document's vectors."""
    if not documents:
        return np.zeros(0, dtype=np.float32)
    return maxsim_stacked(query, *stacked(documents))


@dataclass(frozen=True)
class MultiVectorOptions:
    is_query: bool = False  # plain texts are documents unless the caller says they are queries
    top_n: int | None = None  # ranking inputs: the best top_n texts
    return_documents: bool = False
    truncate: bool = True
    precision: Precision = Precision.FLOAT32  # of the token vectors returned (texts; a ranking scores float32)
    ranges: np.ndarray | None = None  # int8/uint8: from the artifact's output calibration


class MultiVector(TaskSpec):
    name = "multi-vector"
    auto_class = "AutoModel"
    output_names = ("token_embeddings",)
    sequence_outputs = frozenset({"token_embeddings"})
    needs_trained_head = False  # the encoder's own outputs; the projection is loaded beside it (attach_head)
    needs_offsets = False
    ranks = True  # RerankQuery inputs are ranked by MaxSim (rerank(), POST /rerank)
    multi_vectors = True  # a text's result: its token vectors (kiln embed writes a list of vectors per row)
    # Every variant but torch autocast (torch-bf16/fp16 save and reload the transformers model alone, which would
    # drop the projection).
    variants = ("onnx-fp32", "onnx-fused", "onnx-fused-gelu-approx", "onnx-int8-dynamic", "onnx-int8-dynamic-rows",
                "onnx-int8-static", "openvino-fp32", "openvino-bf16", "openvino-int8-static", "openvino-int8-weights",
                "onnx-fp16", "torchscript", "torch-int8-dynamic")
    default_tolerance = Rerank.default_tolerance
    tolerance_help = f"MaxSim ranks per query: mean Kendall tau >= 1-t and mean top-{TOP} overlap >= 1-t"
    metric = Rerank.metric
    eval_fields = Rerank.eval_fields

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._ranges: np.ndarray | None = None  # int8/uint8 ranges, from output_calibration once asked for

    # -- loading ------------------------------------------------------------------------------------------
    @classmethod
    def settings(cls, model_dir: Path, hf_config: Any) -> dict[str, Any]:
        import transformers

        layout = _layout(model_dir)
        given = layout.given(model_dir)
        found = {key: given.get(key, default) if given.get(key) is not None else default
                 for key, default in DEFAULTS.items()}
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        ids = {}
        for key in ("query_prefix", "document_prefix"):
            token_id = tokenizer.convert_tokens_to_ids(found[key])
            if token_id is None or token_id == tokenizer.unk_token_id:
                raise UnsupportedModelError(f"{model_dir}: the {key.replace('_', ' ')} {found[key]!r} is not a token "
                                            "of its tokenizer (PyLate adds it as one; so does kiln's reading)")
            ids[key + "_id"] = int(token_id)
        if tokenizer.mask_token_id is None:
            raise UnsupportedModelError(f"{model_dir}: query expansion needs a [MASK] token; the tokenizer has none")
        words = given.get("skiplist_words")
        words = list(string.punctuation) if words is None else words
        skip = sorted({int(i) for i in tokenizer.convert_tokens_to_ids(list(words)) if i is not None})
        projections = layout.projections(model_dir)
        return {"dimension": projections[-1].out_features if projections else hf_config.hidden_size,
                "late_interaction": {
            "query_length": int(found["query_length"]), "document_length": int(found["document_length"]),
            "expansion_id": int(tokenizer.mask_token_id), "do_query_expansion": bool(found["do_query_expansion"]),
            "attend_to_expansion_tokens": bool(found["attend_to_expansion_tokens"]), "skiplist_ids": skip, **ids}}

    @classmethod
    def attach_head(cls, hf_model: Any, model_dir: Path) -> Any:
        """The encoder followed by its Dense projections: the module every variant is exported from."""
        from kiln.model.late_interaction import LateInteractionModel

        return LateInteractionModel(hf_model, _layout(model_dir).projections(model_dir))

    # -- per call -----------------------------------------------------------------------------------------
    def options(self, is_query: bool = False, top_n: int | None = None, return_documents: bool = False,
                truncate: bool = True, precision: str | Precision = Precision.FLOAT32) -> MultiVectorOptions:
        if top_n is not None and top_n < 1:
            raise UsageError(f"top_n must be at least 1, or None for every text (got {top_n})")
        precision = parse_precision(precision)
        refuse_rejected(self.stored_vectors, self.config.dimension, precision)
        if precision.calibrated and self._ranges is None:  # made once: every int8 request asks for them
            self._ranges = ranges_for(precision, self.output_calibration)
        return MultiVectorOptions(bool(is_query), top_n, return_documents, truncate, precision,
                                  self._ranges if precision.calibrated else None)

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        if all(isinstance(i, str) for i in inputs):
            return list(inputs)
        return [as_rerank_query(item, i) for i, item in enumerate(inputs)]

    def prepare(self, inputs: Sequence[Any], encoder: Any, options: MultiVectorOptions) -> Prepared:
        texts: list[tuple[str, bool]] = []  # (text, is_query) per feature, in order
        owners: list[int] = []
        for i, item in enumerate(inputs):
            mine = [(item, options.is_query)] if isinstance(item, str) else \
                [(item.query, True), *((t, False) for t in item.texts)]
            texts += mine
            owners += [i] * len(mine)
        features: list[Features | None] = [None] * len(texts)
        for is_query in (True, False):  # one tokenizer batch per kind: they are cut to different lengths
            where = [j for j, (_, q) in enumerate(texts) if q is is_query]
            for j, feature in zip(where, self._encode(encoder, [texts[j][0] for j in where], is_query,
                                                      options.truncate)):
                features[j] = feature
        truncated = [False] * len(inputs)
        for owner, feature in zip(owners, features):
            truncated[owner] = truncated[owner] or feature.truncated
        return Prepared(tuple(inputs), tuple(features), tuple(owners), tuple(truncated))

    def _encode(self, encoder: Any, texts: list[str], is_query: bool, truncate: bool) -> list[Features]:
        """PyLate's tokenize: each text with the tokenizer's special tokens, cut to one short of the length, the
        marker inserted after the first token; a query then padded with [MASK] (expansion)."""
        if not texts:
            return []
        late = self.config.late_interaction
        length = late["query_length"] if is_query else late["document_length"]
        marker = late["query_prefix_id" if is_query else "document_prefix_id"]
        features = []
        for encoding in encoder.encode_limited(texts, length - 1 if truncate else None):
            ids = [encoding.ids[0], marker, *encoding.ids[1:]]
            types = [encoding.type_ids[0], 0, *encoding.type_ids[1:]]
            mask = [1] * len(ids)
            if is_query and late["do_query_expansion"] and len(ids) < length:
                extra = length - len(ids)
                ids += [late["expansion_id"]] * extra
                types += [0] * extra
                mask += [int(late["attend_to_expansion_tokens"])] * extra
            features.append(Features(ids, types, mask, is_query=is_query, truncated=len(encoding.overflowing) > 0))
        return features

    def reduce_arrays(self, outputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Each row's L2-normalised token vectors up to its last real position: attended, or a query's [MASK]
        expansion (not attended by default, yet a vector of the query); which ones a feature keeps is
        ``kept``'s (finalize)."""
        real = arrays["attention_mask"].astype(bool) | (arrays["input_ids"] == self.config.late_interaction[
            "expansion_id"])
        lengths = real.shape[1] - np.argmax(real[:, ::-1], axis=1)
        vectors = outputs["token_embeddings"].astype(np.float32, copy=False)
        vectors = vectors / np.clip(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12, None)
        return [row[:n] for row, n in zip(vectors, lengths)]

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError("multi-vector reduces whole batches (reduce_arrays): it needs the input ids")

    def kept(self, feature: Features, vectors: np.ndarray) -> np.ndarray:
        """A feature's token vectors as PyLate returns them: a query's every position (its real tokens alone
        without expansion), a document's real tokens less the skiplist."""
        late = self.config.late_interaction
        ids = np.asarray(feature.ids)
        vectors = vectors[: len(ids)]
        if feature.is_query:
            return vectors if late["do_query_expansion"] else vectors[np.asarray(feature.attention_mask, bool)]
        return vectors[~np.isin(ids, late["skiplist_ids"])]

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: MultiVectorOptions,
                 encoder: Any) -> list[Any]:
        vectors = [self.kept(f, r) for f, r in zip(prepared.encodings, reduced)]
        if all(isinstance(i, str) for i in prepared.inputs):
            return vectors if options.precision is Precision.FLOAT32 else \
                [quantize(v, options.precision, options.ranges) for v in vectors]
        if options.precision is not Precision.FLOAT32:
            raise UsageError(f"precision {options.precision.value} applies to token vectors (texts); a ranking is "
                             "scored in float32")
        results, owners = [], np.array(prepared.owners)
        for i, query in enumerate(prepared.inputs):
            mine = [vectors[j] for j in np.flatnonzero(owners == i)]
            scores = maxsim(mine[0], mine[1:])
            order = ranking(scores)[: options.top_n]
            results.append([Ranked(j, float(scores[j]), query.texts[j] if options.return_documents else None)
                            for j in order])
        return results

    def output_vectors(self, predictor: Any, inputs: Sequence[Any]) -> np.ndarray:
        """The output calibration: token vectors of the calibration queries (as queries) and texts (as documents),
        a seeded sample of CALIBRATION_VECTORS of them when there are more."""
        texts = [t for item in inputs for t in ([item] if isinstance(item, str) else item.texts)]
        queries = [item.query for item in inputs if not isinstance(item, str)]
        found = predictor.predict(texts) + (predictor.predict(queries, is_query=True) if queries else [])
        vectors = np.concatenate(found).astype(np.float32)
        if len(vectors) > CALIBRATION_VECTORS:
            keep = np.random.default_rng(0).choice(len(vectors), CALIBRATION_VECTORS, replace=False)
            vectors = vectors[np.sort(keep)]
        return vectors

    @classmethod
    def retrieval_judgements(cls, data: EvalSet) -> Judgements | None:
        """The --eval rows (query, text, relevance) as retrieval judgements: every query searches every text."""
        return Judgements.of_pairs(data.source, ((item.query, t) for item in data.inputs for t in item.texts),
                                   (label for labels in data.labels for label in labels))

    def comparable(self, reduced: Any) -> np.ndarray:
        return np.asarray(reduced, dtype=np.float32).reshape(-1)

    # -- inputs: a reranker's (queries over texts), so agreement and timing exercise both encodings ---------
    parity_inputs = Rerank.parity_inputs
    agreement_inputs = Rerank.agreement_inputs
    calibration_inputs = Rerank.calibration_inputs
    timing_inputs = Rerank.timing_inputs
    inputs_from_lines = Rerank.inputs_from_lines
    sample_input = Rerank.sample_input
    parse_row = Rerank.parse_row
    read_eval = Rerank.read_eval
    evaluate = Rerank.evaluate
    eval_inputs = Rerank.eval_inputs
    floors = Rerank.floors

    # -- validation ---------------------------------------------------------------------------------------
    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        handler = cls(data.config)
        kept = [[handler.kept(f, r) for f, r in zip(data.prepared.encodings, run.reduced)]
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


class SentenceTransformersLayout:
    """PyLate's (and sentence-transformers'): modules.json lists the Dense projections after the encoder, each in
    its own directory; config_sentence_transformers.json holds the markers, lengths and skiplist."""

    marker = "modules.json"

    @staticmethod
    def given(model_dir: Path) -> dict[str, Any]:
        path = model_dir / "config_sentence_transformers.json"
        return read_json(path) if path.is_file() else {}

    @staticmethod
    def projections(model_dir: Path) -> list[Any]:
        modules = sorted(json.loads((model_dir / "modules.json").read_text()), key=lambda m: m["idx"])
        return [_load_dense(model_dir / m["path"]) for m in modules if m["type"].rsplit(".", 1)[-1] == "Dense"]


class ColbertAiLayout:
    """The original ColBERT's (``colbert-ai``, e.g. colbert-ir/colbertv2.0): one weights file with the encoder under
    ``bert.`` (transformers loads it as the base model) and the bias-free projection as ``linear.weight``, and
    ``artifact.metadata`` (its ColBERTConfig) with the markers (``[unused0]``/``[unused1]``), lengths and whether
    punctuation is masked. Its encoding is PyLate's (both insert the marker after [CLS] and expand queries with
    [MASK] to the query length), so only the names are read differently."""

    marker = "artifact.metadata"

    @staticmethod
    def given(model_dir: Path) -> dict[str, Any]:
        meta = read_json(model_dir / "artifact.metadata")
        return {"query_prefix": meta.get("query_token_id", "[unused0]"),
                "document_prefix": meta.get("doc_token_id", "[unused1]"),
                "query_length": meta.get("query_maxlen", 32), "document_length": meta.get("doc_maxlen", 220),
                "attend_to_expansion_tokens": meta.get("attend_to_mask_tokens", False), "do_query_expansion": True,
                "skiplist_words": list(string.punctuation) if meta.get("mask_punctuation", True) else []}

    @staticmethod
    def projections(model_dir: Path) -> list[Any]:
        import torch

        state = _weights(model_dir)
        if "linear.weight" not in state:
            raise UnsupportedModelError(f"{model_dir}: a colbert-ai checkpoint keeps its projection as linear.weight; "
                                        "its weights have none")
        weight = state["linear.weight"]
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        linear.load_state_dict({"weight": weight})
        return [linear.eval()]


LAYOUTS = (SentenceTransformersLayout, ColbertAiLayout)  # the first whose marker file the checkpoint has


def _layout(model_dir: Path) -> type[SentenceTransformersLayout] | type[ColbertAiLayout]:
    found = next((layout for layout in LAYOUTS if (model_dir / layout.marker).is_file()), None)
    if found is None:
        raise UnsupportedModelError(f"{model_dir} has neither modules.json (PyLate / sentence-transformers layout) nor "
                                    "artifact.metadata (colbert-ai layout): kiln cannot find its projection")
    return found


def _weights(model_dir: Path) -> dict[str, Any]:
    """A checkpoint's tensors: model.safetensors, else pytorch_model.bin read with torch's weights-only loader (kiln
    reached here only if --allow-pickle let the pickled file through: kiln.source.loading.check_weights)."""
    if (model_dir / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(model_dir / "model.safetensors"))
    if (model_dir / "pytorch_model.bin").is_file():
        import torch

        return torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ModelLoadError(f"{model_dir} holds neither model.safetensors nor pytorch_model.bin")


def _load_dense(directory: Path) -> Any:
    """One Dense module as a torch Linear (identity activation only: what ColBERT checkpoints use)."""
    import torch
    from safetensors.torch import load_file

    config = read_json(directory / "config.json")
    activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity"))
    if not activation.endswith("Identity"):
        raise UnsupportedModelError(f"{directory}: kiln reads Dense projections without an activation (got "
                                    f"{activation})")
    if config.get("use_residual"):
        raise UnsupportedModelError(f"{directory}: a residual Dense projection is not supported")
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise ModelLoadError(f"{directory} holds no model.safetensors (pickled Dense weights are refused)")
    state = {k.removeprefix("linear."): v for k, v in load_file(str(weights)).items()}
    linear = torch.nn.Linear(int(config["in_features"]), int(config["out_features"]), bias="bias" in state)
    linear.load_state_dict(state)
    return linear.eval()
