"""Token bytes for OpenAI's logprobs: a byte-level BPE token may hold part of a character."""

from __future__ import annotations

from tokenizers import Tokenizer

from kiln.runtime.tokenization import TextEncoder
from kiln.testing.factory import BERT_WORDPIECE, LLAMA3_BPE, train_tokenizer


def _encoder(family) -> TextEncoder:
    tokenizer: Tokenizer = train_tokenizer(family)
    return TextEncoder(tokenizer, max_length=128, pad_id=0, input_names=("input_ids", "attention_mask"))


def test_a_byte_level_tokens_bytes_join_into_the_text_its_decoding_cannot_show():
    encoder = _encoder(LLAMA3_BPE)
    text = "naïve 日本語"
    ids = encoder.encode([text], special_tokens=False)[0].ids
    pieces = [encoder.token_bytes(i) for i in ids]
    assert b"".join(pieces) == text.encode()
    assert any("\ufffd" in encoder.decode([i]) for i in ids)  # a token alone is part of a character
    bos = encoder.tokenizer.token_to_id(LLAMA3_BPE.cls)
    assert encoder.token_bytes(bos) == b""  # a special token stands for no text


def test_other_tokenizers_give_their_decoded_text():
    encoder = _encoder(BERT_WORDPIECE)
    ids = encoder.encode(["hello world"], special_tokens=False)[0].ids
    assert [encoder.token_bytes(i) for i in ids] == [encoder.decode([i]).encode() for i in ids]
