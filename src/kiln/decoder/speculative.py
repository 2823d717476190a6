"""Speculative decoding with a draft model: a small decoder guesses ``k`` tokens, the target checks them all in one
step on its cache, and the longest prefix the target agrees with is kept, with the target's own next token after
it. Every kept token is the target's greedy choice, so the text is greedy decoding's with the target alone (the
test holds it to that); what changes is how many target steps it takes. A target step over k + 1 tokens costs
little more than over one on a CPU (each step reads every weight once), so when the draft is right often and is
much cheaper than the target, tokens come faster.

Per round, with the target's cache holding every token but the last (``x``) and the draft's cache some prefix:
1. the draft takes the tokens it has not seen in one step, then proposes ``d1..dk`` one step each;
2. the target runs ``x, d1..dk`` in one step: ``g0..gk``, its greedy choice after each;
3. ``d1..dm`` are kept while ``d_i == g_(i-1)``, then ``g_m``: m + 1 new tokens per target step;
4. both caches are cut back to the tokens kept (columns past them are dropped; the last token is fed next round).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.decoder.graph import positions
from kiln.decoder.steps import Stepper, cut, empty_past
from kiln.errors import UsageError

MAX_DRAFT_TOKENS = 16


@dataclass
class Speculation:
    """What a speculative run did: target steps, draft steps, and tokens the target accepted from the draft."""

    target_steps: int = 0
    draft_steps: int = 0
    proposed: int = 0
    accepted: int = 0
    per_round: list[int] = field(default_factory=list)  # tokens kept per target step

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


class _Cached:
    """One model's cache over a single sequence (batch 1, no padding): ``length`` tokens are in it."""

    def __init__(self, steps: Stepper) -> None:
        self.steps, self.past = steps, empty_past(steps.shape, 1)

    @property
    def length(self) -> int:
        return self.past.length

    def run(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed ``tokens`` after the cached ones; logits [len(tokens), vocab]."""
        ids = np.asarray([tokens], dtype=np.int64)
        mask = np.ones((1, self.past.length + len(tokens)), dtype=np.int64)
        logits, self.past = self.steps.step(ids, mask, positions(mask, len(tokens)), self.past)
        return logits[0]

    def cut(self, length: int) -> None:
        """Keep the first ``length`` tokens' keys and values: in place on the fused graph's buffers, a numpy copy
        elsewhere (no runtime memory is held between rounds)."""
        self.past = cut(self.steps, self.past, length)


def check_draft_tokens(count: int) -> None:
    if not 1 <= count <= MAX_DRAFT_TOKENS:
        raise UsageError(f"draft_tokens must be between 1 and {MAX_DRAFT_TOKENS} (got {count})")


def speculative_greedy(target: Stepper, draft: Stepper, prompt: Sequence[int], max_new_tokens: int,
                       eos_ids: frozenset[int], draft_tokens: int = 4,
                       record: Speculation | None = None) -> list[int]:
    """The target's greedy continuation of ``prompt`` (at most ``max_new_tokens``, an EOS included when reached),
    found with ``draft``'s guesses."""
    check_draft_tokens(draft_tokens)
    record = record if record is not None else Speculation()
    big, small = _Cached(target), _Cached(draft)
    sequence = list(prompt)
    first = int(np.argmax(big.run(sequence)[-1]))  # the prompt's prefill: the target's first token
    record.target_steps += 1
    out = [first]
    while out[-1] not in eos_ids and len(out) < max_new_tokens:
        sequence = [*prompt, *out]
        # The draft proposes at most what is still wanted, less the token the target adds itself.
        k = min(draft_tokens, max_new_tokens - len(out) - 1)
        proposal: list[int] = []
        if k:
            logits = small.run(sequence[small.length:])
            record.draft_steps += 1
            proposal.append(int(np.argmax(logits[-1])))
            while len(proposal) < k:
                proposal.append(int(np.argmax(small.run(proposal[-1:])[-1])))
                record.draft_steps += 1
        checked = big.run([sequence[-1], *proposal])  # g0..gk
        record.target_steps += 1
        choices = [int(t) for t in np.argmax(checked, axis=-1)]
        kept = 0
        while kept < len(proposal) and proposal[kept] == choices[kept] and proposal[kept] not in eos_ids:
            kept += 1
        new = [*proposal[:kept], choices[kept]]
        record.proposed, record.accepted = record.proposed + len(proposal), record.accepted + kept
        record.per_round.append(len(new))
        out += new
        big.cut(len(sequence) + kept)  # x and the kept guesses; the target's own token is fed next round
        small.cut(min(small.length, len(sequence) + kept))
    return out
