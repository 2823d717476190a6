"""Causal rerankers (Qwen3-Reranker): a language model asked whether a document meets a query, scored by the
logit of "yes" minus that of "no" at the last position of its prompt (sentence-transformers' ``LogitScore``).

The prompt is the checkpoint's chat template rendered with the pair in the ``query`` and ``document`` roles, the
convention sentence-transformers' CrossEncoder reads such a reranker by. Only two rows of the language-model head
are ever read, so the export replaces the head by their difference: the model becomes the sequence classifier
transformers itself has for the family (``Qwen3ForSequenceClassification``, one logit read at each row's last real
token), what Qwen3-Reranker's "seq-cls" conversions hold. Its logit is the yes/no difference and its sigmoid the
model card's score (the softmax of [no, yes]); a 151k-row head is never computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiln.errors import UnsupportedModelError
from kiln.records.task import PairPrompt

ANSWERS = ("yes", "no")
# Contents no template makes from anything else: each marks where a role's text goes in the render.
_QUERY, _DOCUMENT = "\x00kiln-query\x00", "\x00kiln-document\x00"
# Pairs the template must render exactly as the split text does (sentence-transformers probes its templates too).
_PROBES = (("0", "1 2 3 4"), ("what is python?", "Python is a programming language.\n\nIt reads well."))


def is_causal(config: Mapping[str, Any]) -> bool:
    """Whether config.json describes a language model (``...ForCausalLM``), which reranks by its yes/no answer."""
    return str((config.get("architectures") or [""])[0]).endswith("ForCausalLM")


def answer_ids(tokenizer: Any, name: str) -> tuple[int, int]:
    """The ids of "yes" and "no", each one token of ``tokenizer`` (a transformers tokenizer)."""
    ids = [tokenizer.convert_tokens_to_ids(word) for word in ANSWERS]
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise UnsupportedModelError(f"{name} is a language model, which kiln reranks with as sentence-transformers "
                                    "does (the logit of 'yes' minus 'no'), but its tokenizer has no single 'yes' "
                                    "and 'no' tokens")
    yes, no = ids
    return yes, no


def _messages(query: str, document: str) -> list[dict[str, str]]:
    return [{"role": "query", "content": query}, {"role": "document", "content": document}]


def pair_prompt(tokenizer: Any, name: str) -> PairPrompt:
    """The checkpoint's chat template as the text around a pair, checked to render every probe pair exactly."""
    if not getattr(tokenizer, "chat_template", None):
        raise UnsupportedModelError(
            f"{name} is a language model with no chat template, so kiln cannot tell how it reads a query and a "
            "document. Add one that renders the 'query' and 'document' roles (chat_template.jinja beside the "
            "model, as sentence-transformers' CrossEncoder needs), e.g. Qwen3-Reranker's prompt around "
            "'<Query>: {{ query }}' and '<Document>: {{ document }}'")
    try:
        marked = tokenizer.apply_chat_template(_messages(_QUERY, _DOCUMENT), tokenize=False)
    except Exception as err:  # Jinja raises its own errors (and the template's raise_exception) for bad templates
        raise UnsupportedModelError(f"{name}'s chat template cannot render a query/document pair: "
                                    f"{type(err).__name__}: {err}") from err
    if marked.count(_QUERY) != 1 or marked.count(_DOCUMENT) != 1 or marked.index(_QUERY) > marked.index(_DOCUMENT):
        raise UnsupportedModelError(
            f"{name}'s chat template does not place the 'query' content once and then the 'document' content "
            "once; kiln scores a pair as the query, then the document, in the model's own prompt")
    prefix, rest = marked.split(_QUERY)
    between, suffix = rest.split(_DOCUMENT)
    for query, document in _PROBES:
        want = tokenizer.apply_chat_template(_messages(query, document), tokenize=False)
        if want != prefix + query + between + document + suffix:
            raise UnsupportedModelError(f"{name}'s chat template changes the text it is given (rendering "
                                        f"{query!r} / {document!r}); kiln renders pairs by placing them verbatim")
    ids = [tokenizer(prefix + q + between + d + suffix, add_special_tokens=False)["input_ids"] for q, d in _PROBES]
    shared = next((n for n, (a, b) in enumerate(zip(reversed(ids[0]), reversed(ids[1])))
                   if a != b), min(map(len, ids)))
    tail = tuple(ids[0][len(ids[0]) - shared:])
    if tail and tail[-1] == tokenizer.pad_token_id:
        raise UnsupportedModelError(f"{name}'s prompt ends with its padding token, which the score's last-token "
                                    "read would skip")
    return PairPrompt(prefix, between, suffix, tail, answer_ids(tokenizer, name))


def settings(model_dir: Path, tokenizer: Any) -> dict[str, Any]:
    """TaskConfig fields of a causal reranker: its one logit, and its prompt."""
    return {"id2label": {0: "yes"}, "pair_prompt": pair_prompt(tokenizer, str(model_dir))}


def as_classifier(lm: Any, answers: tuple[int, int], pad_id: int) -> Any:
    """``lm``'s body under a one-logit head whose weights are its "yes" row minus its "no" row: the family's own
    sequence classifier (transformers ships one for each decoder family kiln reranks with). It reads each row at
    its last token that is not ``pad_id``, so that must be the id batches are padded with."""
    import torch
    import transformers

    config = lm.config.__class__.from_dict({**lm.config.to_dict(), "num_labels": 1, "id2label": {0: "yes"},
                                             "label2id": {"yes": 0}, "architectures": None})
    config.pad_token_id = pad_id
    classifier = transformers.AutoModelForSequenceClassification.from_config(
        config, attn_implementation=lm.config._attn_implementation)
    body = lm.base_model_prefix
    getattr(classifier, body).load_state_dict(getattr(lm, body).state_dict())
    head = lm.get_output_embeddings()
    yes, no = answers
    with torch.no_grad():
        classifier.score.weight.copy_((head.weight[yes] - head.weight[no]).unsqueeze(0))
        if head.bias is not None or getattr(classifier.score, "bias", None) is not None:
            raise UnsupportedModelError("a language-model head with a bias is not verified by kiln's reranker "
                                        "conversion")
    return classifier.eval()
