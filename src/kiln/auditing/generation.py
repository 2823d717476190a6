"""What `kiln audit` measures of a decoder's deployment against the original decoder: its greedy text.

The audit sends prompts (from a few tokens to a few hundred) to the server's completions API at temperature 0 and
compares each answer with the original's own greedy continuation in PyTorch fp32 (transformers' ``generate``): the
share of the original's tokens the answer reproduces before its first difference, the measure kiln optimize's gate
holds a decoder variant to (kiln.tasks.text_generation.validation). The comparison is on text, token by token of the
original's continuation, so a server that tokenizes its output differently is not counted wrong for it. Each cause is
measured:
- prompt tokens: the prompt length the server reports (``usage.prompt_tokens``) against the original tokenizer's
  (a missing or doubled BOS token, another tokenizer);
- determinism: the first prompt sent again gives the same answer (a server that samples at temperature 0 does not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.auditing.protocols import Endpoint, complete
from kiln.auditing.result import AuditResult, Finding, buckets
from kiln.decoder.stopping import eos_ids
from kiln.scoring import greedy_figures

NEW_TOKENS = 24  # a continuation's length: where int4 and int8 schemes part from the original (RESULTS.md, Decoders)
LONGEST_PROMPT = 256  # built-in prompts reach this many tokens, or the model's window less NEW_TOKENS


class GreedyReference:
    """The source decoder run eagerly in fp32: its greedy continuation of each prompt (to its first EOS)."""

    def __init__(self, source: Any, new_tokens: int = NEW_TOKENS) -> None:
        self.model, self.tokenizer, self.new_tokens = source.model.eval(), source.tokenizer, new_tokens
        window = getattr(source.model.config, "max_position_embeddings", None) or LONGEST_PROMPT + new_tokens
        self.longest = max(8, min(LONGEST_PROMPT, window - new_tokens))
        self.configured = f"greedy, {new_tokens} new tokens"

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(list(texts))["input_ids"]]

    def continuation(self, prompt: str) -> list[int]:
        import torch

        ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        eos = self.model.generation_config.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.new_tokens,
                                      do_sample=False, num_beams=1, pad_token_id=pad)
        tokens = out[0, ids.shape[1]:].tolist()
        stops = set(eos_ids(eos))
        cut = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
        return tokens[:cut]

    def kept(self, tokens: Sequence[int], answer: str) -> int:
        """How many of the original's ``tokens`` the served ``answer`` reproduces before the first difference."""
        kept = 0
        for end in range(1, len(tokens) + 1):
            text = self.tokenizer.decode(tokens[:end], skip_special_tokens=True)
            if text.endswith("\ufffd") and end < len(tokens):
                continue  # a character split across tokens: judged once its last byte is in
            if not answer.startswith(text):
                break
            kept = end
        return kept


def builtin_prompts(reference: GreedyReference, count: int) -> list[str]:
    from kiln.data import corpus
    from kiln.data.texts import texts_of_lengths

    step = max(1, (reference.longest - 4) // count)
    return texts_of_lengths([4 + i * step for i in range(count)], seed=7,
                            token_count=lambda t: reference.token_counts([t])[0], source=corpus.sentences("held-out"))


def diagnose(endpoint: Endpoint, reference: GreedyReference, prompts: Sequence[str], tolerance: float, model: str,
             task: str) -> AuditResult:
    original = [reference.continuation(p) for p in prompts]
    answers = [complete(endpoint, p, reference.new_tokens) for p in prompts]
    kept = [reference.kept(tokens, text) for tokens, (text, _) in zip(original, answers)]
    shares = np.array([k / len(t) if t else 1.0 for k, t in zip(kept, original)])
    # identical: every token of the original's continuation reproduced (a server may write past it to max_tokens)
    figures = greedy_figures(kept, [len(t) for t in original], [k == len(t) for k, t in zip(kept, original)])
    lengths = reference.token_counts(prompts)
    findings = [_prompt_tokens(lengths, [n for _, n in answers]), _determinism(endpoint, prompts[0], answers[0][0],
                                                                              reference.new_tokens)]
    # The gate's rule for greedy text (kiln.tasks.text_generation.validation): the share of the original's tokens
    # kept, over all prompts, at least 1 - 2 x tolerance.
    floor = 1.0 - 2 * tolerance
    return AuditResult(
        url=endpoint.url, protocol=endpoint.protocol.value, task=task, model=model, configured=reference.configured,
        inputs=len(prompts), tolerance=tolerance, agreement="greedy agreement", min_agreement=float(shares.min()),
        mean_agreement=figures["greedy_agreement"], floor=floor, buckets=buckets(lengths, shares),
        findings=tuple(findings), explained_by=(), explained_min=None,
        within_tolerance=figures["greedy_agreement"] >= floor, figures=figures, judged="mean")


def _prompt_tokens(lengths: Sequence[int], reported: Sequence[int | None]) -> Finding:
    pairs = [(mine, theirs) for mine, theirs in zip(lengths, reported) if theirs is not None]
    if not pairs:
        return Finding("prompt tokens", "the server reports no usage.prompt_tokens", False, float("nan"))
    off = [theirs - mine for mine, theirs in pairs]
    worst = max(off, key=abs)
    found = (f"the server counts each prompt as the original tokenizer does ({len(pairs)} prompts)" if not worst else
             f"{sum(1 for d in off if d)} of {len(pairs)} prompts counted differently by the server (up to {worst:+d} "
             "tokens: a BOS token added or dropped, or another tokenizer)")
    return Finding("prompt tokens", found, bool(worst), float(worst))


def _determinism(endpoint: Endpoint, prompt: str, first: str, new_tokens: int) -> Finding:
    again, _ = complete(endpoint, prompt, new_tokens)
    same = again == first
    return Finding("determinism", "the first prompt sent again: the same answer" if same else
                   "the first prompt sent again: another answer (the server samples at temperature 0)",
                   not same, 1.0 if same else 0.0)
