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
        raise UsageError(f"continuations must be 0 or more (got {count})")


def opening(ids: Sequence[int]) -> list[int]:
    """A text's first half, at most OPENING_TOKENS tokens, at least one."""
    return list(ids[: max(1, min(OPENING_TOKENS, len(ids) // 2))])


def teacher_continuations(model: Any, tokenizer: Any, texts: Sequence[str], *, new_tokens: int = NEW_TOKENS,
                          past_eos: bool = False, batch_size: int = BATCH_SIZE,
                          progress: Callable[[int, int], None] = lambda done, total: None) -> list[str]:
    """Each text's opening followed by ``model``'s greedy continuation of it, decoded to text; texts that tokenize to
    nothing are skipped. A continuation ends at the model's EOS (dropped from the text), as served decoding does;
    ``past_eos`` goes on through it, keeping it in the text, for a draft whose target decodes past EOS."""
    openings = [o for o in (opening(tokenizer(t)["input_ids"]) for t in texts) if o]
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    # Longest first, so each batch pads little; the order of the training texts does not matter.
    openings.sort(key=len, reverse=True)
    out: list[str] = []
    for start in range(0, len(openings), batch_size):
        batch = openings[start : start + batch_size]
        for o, row in zip(batch, _greedy(model, batch, new_tokens, pad, frozenset() if past_eos else eos)):
            out.append(tokenizer.decode(o + row, skip_special_tokens=not past_eos).replace("\n", " "))
        progress(min(start + batch_size, len(openings)), len(openings))
    return out


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    found = getattr(model.generation_config, "eos_token_id", None)
    found = tokenizer.eos_token_id if found is None else found
    return frozenset([found] if isinstance(found, int) else found or ())


def _greedy(model: Any, openings: list[list[int]], new_tokens: int, pad: int, eos: frozenset[int]) -> list[list[int]]:
    """Greedy decoding on the model's cache, rows left padded (positions counted from each row's first token); a row
    that reached EOS stops (its EOS kept) while the others go on. transformers' generate is not used: it stops at the
    model's EOS whatever generation config it is given."""
    import torch

    width = max(map(len, openings))
    ids = torch.tensor([[pad] * (width - len(o)) + o for o in openings])
    mask = torch.tensor([[0] * (width - len(o)) + [1] * len(o) for o in openings])
    made: list[list[int]] = [[] for _ in openings]
    done = [False] * len(openings)
    past = None
    with torch.no_grad():
        for _ in range(new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
            result = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=past,
                           use_cache=True)
            past, chosen = result.past_key_values, result.logits[:, -1].argmax(-1).tolist()
            for row, token in enumerate(chosen):
                if not done[row]:
                    made[row].append(token)
                    done[row] = token in eos
            if all(done):
                break
            ids = torch.tensor([[t] for t in chosen])
            mask = torch.cat([mask, torch.ones(len(openings), 1, dtype=mask.dtype)], dim=1)
    return made
