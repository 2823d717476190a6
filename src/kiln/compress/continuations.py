"""A decoder teacher's own greedy continuations, as distillation text for a draft model.

A draft for speculative decoding (kiln.decoder.speculative) is worth what its guesses of the *target's greedy
output* are worth; a student distilled on natural text learns the teacher on text people wrote, which is not what
the teacher writes. Each training text's opening is continued greedily by the teacher (PyTorch, batched, left
padded) and the whole is added to the training texts: the student then sees the teacher's own text, labelled by the
teacher as every other input is (DistillSpec's on-policy data, Zhou et al. 2023). On the 42M GPT-2 of
benchmarks/speculative.py this raised the draft's acceptance at one guess a round from 0.35 to 0.85.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.errors import UsageError

NEW_TOKENS = 64  # continued this far (or to EOS): about a served answer's length
OPENING_TOKENS = 32  # at most this much of a text is kept as the opening; at most half of it
BATCH_SIZE = 16


def check_count(count: int) -> None:
    if count < 0:
        raise UsageError(f"--continuations must be 0 or more (got {count})")


def opening(ids: Sequence[int]) -> list[int]:
    """A text's first half, at most OPENING_TOKENS tokens, at least one."""
    return list(ids[: max(1, min(OPENING_TOKENS, len(ids) // 2))])


def teacher_continuations(model: Any, tokenizer: Any, texts: Sequence[str], *, new_tokens: int = NEW_TOKENS,
                          batch_size: int = BATCH_SIZE,
                          progress: Callable[[int, int], None] = lambda done, total: None) -> list[str]:
    """Each text's opening followed by ``model``'s greedy continuation of it, decoded to text (special tokens
    dropped); texts that tokenize to nothing are skipped."""
    import torch

    openings = [o for o in (opening(tokenizer(t)["input_ids"]) for t in texts) if o]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # Longest first, so each batch pads little; the order of the training texts does not matter.
    openings.sort(key=len, reverse=True)
    out: list[str] = []
    for start in range(0, len(openings), batch_size):
        batch = openings[start : start + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(o)) + o for o in batch])  # left padded: every row ends together
        mask = torch.tensor([[0] * (width - len(o)) + [1] * len(o) for o in batch])
        with torch.no_grad():
            made = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1,
                                  max_new_tokens=new_tokens, pad_token_id=pad)
        for row, o in zip(made[:, width:].tolist(), batch):
            out.append(tokenizer.decode(o + row, skip_special_tokens=True).replace("\n", " "))
        progress(min(start + batch_size, len(openings)), len(openings))
    return out
