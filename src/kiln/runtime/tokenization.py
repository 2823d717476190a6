"""Tokenization on the `tokenizers` library alone (no torch, no transformers), and batch padding."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from kiln.choices import TruncationSide
from kiln.errors import ArtifactError, UsageError

TOKENIZER_FILE = "tokenizer.json"


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet read backwards: the printable character each byte is written as -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(shifted)}}


_BYTE_OF = _byte_alphabet()


@dataclass(frozen=True)
class Features:
    """Model inputs a task built itself, where a tokenizer's Encoding cannot say them: ColBERT's marker token and
    query expansion, whose [MASK] positions are inputs (and outputs) but, by default, not attended to."""

    ids: list[int]
    type_ids: list[int]
    attention_mask: list[int]
    is_query: bool = False
    truncated: bool = False

    @property
    def overflowing(self) -> list[Any]:  # an Encoding's, for code that asks whether a text was cut
        return [None] if self.truncated else []


class TextEncoder:
    """Turns text (or text pairs) into unpadded encodings and pads groups of them into model inputs.

    Padding is kept out of the tokenizer so the caller decides how to group encodings (by length).
    """

    def __init__(self, tokenizer: Tokenizer, *, max_length: int, pad_id: int, input_names: Sequence[str]):
        self.max_length = max_length
        self.pad_id = pad_id
        self.input_names = tuple(input_names)
        self._plain = _configured(tokenizer, max_length)
        self._untruncated = _configured(tokenizer, None)
        self._left: Tokenizer | None = None  # cuts an input's start instead (made when first asked for)
        self._windowed: dict[tuple[int, int], Tokenizer] = {}
        self._chunkers: dict[tuple[int, int], Tokenizer] = {}
        self._limited: dict[int, Tokenizer] = {}

    @classmethod
    def from_file(cls, path: Path, *, max_length: int, pad_id: int, input_names: Sequence[str]) -> TextEncoder:
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # the tokenizers library raises a bare Exception on bad files
            raise ArtifactError(f"cannot read tokenizer {path}: {err}") from err
        return cls(tokenizer, max_length=max_length, pad_id=pad_id, input_names=input_names)

    @property
    def tokenizer(self) -> Tokenizer:
        return self._plain

    def encode(self, texts: Sequence[str | tuple[str, str]], *, truncate: bool = True,
               offsets: bool = True, special_tokens: bool = True,
               side: TruncationSide = TruncationSide.RIGHT) -> list[Encoding]:
        """Encode texts or (text, text pair) tuples with special tokens, as the model's tokenizer does pairs.

        Truncated to ``max_length`` unless ``truncate`` is False, at the end (``side`` left: at the start; the
        special tokens are added after the cut, so both ends keep theirs); an over-long pair loses tokens from its
        longer text first (longest-first, the transformers default). ``offsets=False`` skips the character
        offsets (the same ids, about a fifth faster: what a static table's throughput is bound by) for a caller
        that never reads them. ``special_tokens=False``: none added (a rendered chat template holds its own, as
        transformers' ``apply_chat_template`` tokenizes it).
        """
        tokenizer = self._plain if truncate else self._untruncated
        if truncate and side is TruncationSide.LEFT:
            if self._left is None:
                self._left = _configured(self._plain, self.max_length, direction="left")
            tokenizer = self._left
        encode = tokenizer.encode_batch if offsets else tokenizer.encode_batch_fast
        return encode(list(texts), add_special_tokens=special_tokens)

    def encode_limited(self, texts: Sequence[str], max_length: int | None) -> list[Encoding]:
        """Texts with special tokens, cut to ``max_length`` tokens (None: not cut), whatever the model's maximum
        (a ColBERT query's own length); one batch call, without character offsets."""
        if max_length is None:
            tokenizer = self._untruncated
        else:
            if max_length not in self._limited:
                self._limited[max_length] = _configured(self._plain, max_length)
            tokenizer = self._limited[max_length]
        return tokenizer.encode_batch_fast(list(texts), add_special_tokens=True)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated token ids, special tokens left out."""
        return self._plain.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (OpenAI's logprobs ``bytes``): a byte-level BPE token may hold part of a
        character, which its decoded text shows as U+FFFD, so its own bytes are read from its byte-level form; other
        tokenizers' tokens as their decoded text. A special token (left out of decoded text) stands for none."""
        text = self.decode([token])
        piece = self._plain.id_to_token(token) if text and self._byte_level else None
        if piece is not None and all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return text.encode()

    @cached_property
    def _byte_level(self) -> bool:
        return '"ByteLevel"' in json.dumps(json.loads(self._plain.to_str()).get("decoder"))

    def token_count(self, text: str) -> int:
        """Tokens ``text`` encodes to, special tokens included, without truncation."""
        return len(self._untruncated.encode(text, add_special_tokens=True).ids)

    def encode_windows(self, first: str, second: str, *, max_length: int, stride: int) -> list[Encoding]:
        """Encode a pair, splitting a long second text into overlapping windows (QA doc stride).

        The stride must be shorter than the room the first text leaves in a window (the tokenizers library
        panics otherwise); a long first text shrinks the stride to half that room.
        """
        room = max_length - len(self._untruncated.encode(first, add_special_tokens=False).ids) \
            - self._plain.num_special_tokens_to_add(is_pair=True)
        if room < 2:
            raise UsageError(f"the question takes {max_length - room} of the {max_length} tokens of a window; "
                             "shorten it or raise max_seq_len")
        stride = stride if stride < room else room // 2
        key = (max_length, stride)
        if key not in self._windowed:
            tok = Tokenizer.from_str(self._plain.to_str())
            tok.no_padding()
            tok.enable_truncation(max_length, stride=stride, strategy="only_second")
            self._windowed[key] = tok
        encoding = self._windowed[key].encode(first, second, add_special_tokens=True)
        return [encoding, *encoding.overflowing]

    @property
    def room(self) -> int:
        """Tokens of one text that fit the model's window besides its special tokens."""
        return self.max_length - self._plain.num_special_tokens_to_add(is_pair=False)

    def encode_chunks(self, text: str, *, size: int, overlap: int) -> list[Encoding]:
        """``text`` as windows of ``size`` text tokens (plus special tokens), each repeating ``overlap`` tokens of
        the previous one: the tokenizer's own truncation with a stride, so windows are cut from one encoding."""
        key = (size + self._plain.num_special_tokens_to_add(is_pair=False), overlap)
        if key not in self._chunkers:
            tok = Tokenizer.from_str(self._plain.to_str())
            tok.no_padding()
            tok.enable_truncation(key[0], stride=overlap)
            self._chunkers[key] = tok
        encoding = self._chunkers[key].encode(text, add_special_tokens=True)
        return [encoding, *encoding.overflowing]

    def collate(
        self, encodings: Sequence[Encoding], dtype: type = np.int64, multiple: int = 1
    ) -> dict[str, np.ndarray]:
        """Pad encodings to the longest of them (rounded up to ``multiple``); arrays by model input name."""
        rows = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        width = padded_width(int(lengths.max()), multiple)
        real = np.arange(width)[None, :] < lengths[:, None]
        count = int(lengths.sum())
        attended = real
        if isinstance(encodings[0], Features):  # a task's own features carry their attention mask
            attended = np.zeros_like(real)
            attended[real] = np.fromiter(itertools.chain.from_iterable(e.attention_mask for e in encodings),
                                         dtype=bool, count=count)

        def padded(values: Iterable[Sequence[int]], fill: int) -> np.ndarray:
            # One flat copy into the real positions (row-major, so row by row in order): no Python loop per row.
            out = np.full((len(rows), width), fill, dtype=dtype)
            out[real] = np.fromiter(itertools.chain.from_iterable(values), dtype=dtype, count=count)
            return out

        arrays = {"input_ids": lambda: padded(rows, self.pad_id), "attention_mask": lambda: attended.astype(dtype),
                  "token_type_ids": lambda: padded((e.type_ids for e in encodings), 0)}
        return {name: arrays[name]() for name in self.input_names}


def padded_width(length: int, multiple: int) -> int:
    """The width a batch whose longest feature has ``length`` tokens is padded to (``collate``)."""
    return -(-length // multiple) * multiple


def _configured(tokenizer: Tokenizer, max_length: int | None, direction: str = "right") -> Tokenizer:
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()
    if max_length is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length, direction=direction)
    return tok
