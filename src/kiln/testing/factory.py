"""Tiny random-weight models with locally trained tokenizers, for every supported architecture.

Nothing is downloaded: each tokenizer is trained on kiln's built-in sentences, each model is built from a
transformers config (hidden size 32, 2 layers) and saved as safetensors with the task's head.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from kiln.data.texts import builtin_sentences
from kiln.tasks import TaskName, task_spec

LABELS = {
    TaskName.TEXT_CLASSIFICATION: ["negative", "neutral", "positive"],
    TaskName.TOKEN_CLASSIFICATION: ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"],
}
MAX_POSITIONS = 128
BENCHMARK_LENGTH = 512  # the tokenizer's maximum in a real-shaped model (build_tiny_model's ``shape``)


@dataclass(frozen=True)
class Family:
    """How a model family tokenizes: algorithm, special tokens in id order, templates."""

    kind: str  # wordpiece | bpe | unigram
    specials: tuple[str, ...]  # pad, unk, cls/bos, sep/eos, mask (in the family's id order)
    cls: str
    sep: str
    pad: str
    unk: str
    mask: str
    pair_separator: str  # RoBERTa-style pairs put two separators between the texts
    type_ids: bool  # whether the tokenizer returns token_type_ids
    template: bool = True  # False: no special tokens around a text (GPT-2's tokenizer adds none)
    eos_only: bool = False  # the template ends each text with ``sep`` and opens none (Qwen3-Embedding's tokenizer)
    bos_only: bool = False  # the template opens each text with ``cls`` and closes none (Llama 3's tokenizer)
    words: tuple[str, ...] = ()  # trained in often enough to be whole tokens (a reranker's "yes" and "no")
    max_length: int = MAX_POSITIONS  # the tokenizer's model_max_length


BERT_WORDPIECE = Family("wordpiece", ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"), "[CLS]", "[SEP]", "[PAD]",
                        "[UNK]", "[MASK]", "[SEP]", True)
ROBERTA_BPE = Family("bpe", ("<s>", "<pad>", "</s>", "<unk>", "<mask>"), "<s>", "</s>", "<pad>", "<unk>", "<mask>",
                     "</s> </s>", False)
XLMR_UNIGRAM = Family("unigram", ("<s>", "<pad>", "</s>", "<unk>", "<mask>"), "<s>", "</s>", "<pad>", "<unk>",
                      "<mask>", "</s> </s>", False)
SPM_UNIGRAM = Family("unigram", ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"), "[CLS]", "[SEP]", "<pad>", "<unk>",
                     "[MASK]", "[SEP]", True)
MPNET_WORDPIECE = Family("wordpiece", ("<s>", "<pad>", "</s>", "[UNK]", "<mask>"), "<s>", "</s>", "<pad>", "[UNK]",
                         "<mask>", "</s> </s>", False)
MODERNBERT_BPE = Family("bpe", ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"), "[CLS]", "[SEP]", "[PAD]", "[UNK]",
                        "[MASK]", "[SEP]", False)
DISTIL_WORDPIECE = Family("wordpiece", BERT_WORDPIECE.specials, "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]",
                          "[SEP]", False)

# GPT-2's byte-level BPE: one special token, <|endoftext|>, that is its BOS, EOS and unknown token; no padding token.
GPT_BPE = Family("bpe", ("<|endoftext|>",), "<|endoftext|>", "<|endoftext|>", "<|endoftext|>", "<|endoftext|>",
                 "<|endoftext|>", "", False, template=False)

# Qwen's byte-level BPE: <|endoftext|> pads and, in Qwen3-Embedding's tokenizer, ends every text (its last-token
# pooling reads that token); the chat markers a reranker's prompt uses are special tokens too.
QWEN_BPE = Family("bpe", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|endoftext|>", "<|endoftext|>",
                  "<|endoftext|>", "<|endoftext|>", "<|endoftext|>", "", False, eos_only=True, words=("yes", "no"),
                  max_length=512)  # a reranker's prompt template alone is ~150 of its 500-token vocabulary's tokens

# Llama 3's byte-level BPE: <|begin_of_text|> opens every text (its tokenizer adds it), <|end_of_text|> ends
# generation, no padding token; its chat template's headers and turn end are special tokens too.
LLAMA3_BPE = Family("bpe", ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                            "<|eot_id|>"), "<|begin_of_text|>", "<|end_of_text|>", "<|end_of_text|>",
                    "<|end_of_text|>", "<|end_of_text|>", "", False, bos_only=True)

# Gemma's specials in their id order (pad 0, eos 1, bos 2, unk 3, mask 4); a text is <bos> ... <eos>.
GEMMA_BPE = Family("bpe", ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>"), "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
                   "<eos>", False)
# The Gemma-3 language models' tokenizer: Gemma's specials, <bos> opening every text and none closing it, and the
# chat template's turn markers.
GEMMA_CHAT_BPE = Family("bpe", ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
                        "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "", False, bos_only=True)

# Chat templates of the tiny generators, in the shapes of the real ones: Llama 3's headers (BOS first, each message
# trimmed, an unknown role refused by the template itself) and Qwen's ChatML (with its special markers).
LLAMA3_CHAT = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('Only system, user and assistant roles are supported') }}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")
CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
GEMMA_CHAT = (  # Gemma 3's turns: the assistant is "model", each turn closed by <end_of_turn>
    "{{- bos_token }}{%- for message in messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}")
CHAT_TEMPLATES = {"llama": LLAMA3_CHAT, "qwen3": CHATML, "gemma3": GEMMA_CHAT}

_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
ARCHITECTURES: dict[str, tuple[Family, type, dict]] = {
    "bert": (BERT_WORDPIECE, transformers.BertConfig, dict(_SMALL, max_position_embeddings=MAX_POSITIONS)),
    "roberta": (ROBERTA_BPE, transformers.RobertaConfig, dict(_SMALL, max_position_embeddings=MAX_POSITIONS + 2,
                                                               type_vocab_size=1)),
    "xlm-roberta": (XLMR_UNIGRAM, transformers.XLMRobertaConfig,
                    dict(_SMALL, max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1)),
    "distilbert": (DISTIL_WORDPIECE, transformers.DistilBertConfig,
                   dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=MAX_POSITIONS)),
    "albert": (SPM_UNIGRAM, transformers.AlbertConfig, dict(_SMALL, embedding_size=16,
                                                            max_position_embeddings=MAX_POSITIONS)),
    "electra": (BERT_WORDPIECE, transformers.ElectraConfig, dict(_SMALL, embedding_size=16,
                                                                 max_position_embeddings=MAX_POSITIONS)),
    "mpnet": (MPNET_WORDPIECE, transformers.MPNetConfig, dict(_SMALL, max_position_embeddings=MAX_POSITIONS + 2)),
    # global / sliding (16-token window) / global attention with rotary positions: texts past 16 tokens exercise
    # the sliding mask.
    "modernbert": (MODERNBERT_BPE, transformers.ModernBertConfig,
                   dict(_SMALL, num_hidden_layers=3, global_attn_every_n_layers=2, local_attention=16,
                        max_position_embeddings=MAX_POSITIONS, layer_types=["full_attention", "sliding_attention",
                                                                             "full_attention"])),
    # Rotary positions and a SwiGLU feed-forward (nomic-embed-text), with BERT's uncased WordPiece.
    "nomic_bert": (BERT_WORDPIECE, transformers.NomicBertConfig,
                   dict(_SMALL, head_dim=16, max_position_embeddings=MAX_POSITIONS)),
    # Alibaba's GTE (gte-multilingual, snowflake-arctic-embed-m-v2.0): rotary positions, XLM-R's tokenizer.
    "gte": (XLMR_UNIGRAM, transformers.GteConfig, dict(_SMALL, max_position_embeddings=MAX_POSITIONS,
                                                         type_vocab_size=1)),
    # Jina v3's encoder: XLM-R with rotary positions (its task LoRA adapters are not part of transformers' class).
    "jina_embeddings_v3": (XLMR_UNIGRAM, transformers.JinaEmbeddingsV3Config,
                           dict(_SMALL, max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1)),
    "gpt2": (GPT_BPE, transformers.GPT2Config, dict(n_embd=32, n_layer=2, n_head=2, n_positions=MAX_POSITIONS)),
    # global then local attention with an 8-token window: texts past 8 tokens exercise the local mask.
    "gpt_neo": (GPT_BPE, transformers.GPTNeoConfig,
                dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, window_size=8,
                     attention_types=[[["global", "local"], 1]], max_position_embeddings=MAX_POSITIONS)),
    # Qwen3 as Qwen3-Embedding and Qwen3-Reranker use it: a causal encoder (rotary positions, grouped-query
    # attention with 4 query heads over 2 key/value heads, RMSNorm, SwiGLU). Heads of 16: ONNX Runtime's attention op
    # rotates only head sizes that are multiples of 16 (the fused step graph's generation).
    "qwen3": (QWEN_BPE, transformers.Qwen3Config,
              dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   intermediate_size=64, max_position_embeddings=QWEN_BPE.max_length, tie_word_embeddings=True)),
    # Llama 3.2's shape in miniature: grouped-query attention (4 query heads over 2 key/value heads), RMSNorm, SwiGLU,
    # untied embeddings and Llama 3's rotary frequency scaling; a byte-level BPE with Llama 3's special tokens.
    "llama": (LLAMA3_BPE, transformers.LlamaConfig,
              dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   intermediate_size=64, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 32})),
    # EmbeddingGemma: Gemma 3's text model with bidirectional attention; sliding layers see 8 positions on either
    # side, so texts past 8 tokens exercise the window.
    "gemma3_text": (GEMMA_BPE, transformers.Gemma3TextConfig,
                    dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         intermediate_size=64, max_position_embeddings=MAX_POSITIONS, sliding_window=8,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                         use_bidirectional_attention=True)),
    # The Gemma-3 language models in miniature (causal): sliding layers see the last 8 positions, so prompts and
    # continuations past 8 tokens exercise the window; q/k norms, grouped-query attention, GeGLU.
    "gemma3": (GEMMA_CHAT_BPE, transformers.Gemma3TextConfig,
               dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=64, max_position_embeddings=MAX_POSITIONS, sliding_window=8,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    "deberta-v2": (SPM_UNIGRAM, transformers.DebertaV2Config,
                   dict(_SMALL, max_position_embeddings=MAX_POSITIONS, relative_attention=True, position_buckets=32,
                        pos_att_type=["p2c", "c2p"], type_vocab_size=0)),
}


# The bidirectional encoders distillation and pruning apply to (GPT-2, GPT-Neo and Qwen3 are causal; EmbeddingGemma's
# Gemma 3 is not verified for them).
ENCODERS = tuple(a for a, (family, _, _) in ARCHITECTURES.items()
                 if family.template and not family.eos_only and not family.bos_only and a != "gemma3_text")


def _corpus(words: tuple[str, ...] = ()) -> list[str]:
    extra = ["Anna Schmidt works for Acme Corporation in Berlin.", "Jean Dupont visited Paris and Lyon.",
             "unbelievably tokenization antidisestablishmentarianism"]
    return list(builtin_sentences()) * 3 + extra * 5 + list(words) * 500


TOKENIZERS = Path(__file__).parent / "tokenizers"


def train_tokenizer(family: Family) -> Tokenizer:
    """The family's tokenizer, trained on kiln's built-in sentences once and kept in kiln/testing/tokenizers.

    The tokenizers library's trainers break ties in a per-process random order, so a tokenizer trained anew in
    each session gives a different tiny model each session; the kept files make every session's models identical.
    Delete a file to train it again.
    """
    cached = TOKENIZERS / (re.sub(r"[^a-z0-9]+", "-", f"{family.kind} {' '.join(family.specials)}".lower()).strip("-")
                           + ".json")
    if cached.is_file():
        tok = Tokenizer.from_file(str(cached))
    else:
        tok = _train(family)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(cached))
    if not family.template:
        return tok
    cls, sep = family.cls, family.sep
    if family.bos_only:
        tok.post_processor = processors.TemplateProcessing(single=f"{cls} $A", pair=f"{cls} $A {cls}:1 $B:1",
                                                           special_tokens=[(cls, tok.token_to_id(cls))])
        return tok
    if family.eos_only:
        tok.post_processor = processors.TemplateProcessing(single=f"$A {sep}", pair=f"$A {sep} $B:1 {sep}:1",
                                                           special_tokens=[(sep, tok.token_to_id(sep))])
        return tok
    second = "$B:1" if family.type_ids else "$B"
    sep2 = f"{sep}:1" if family.type_ids else sep
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {family.pair_separator} {second} {sep2}",
        special_tokens=[(t, tok.token_to_id(t)) for t in {cls, sep}],
    )
    return tok


def _train(family: Family) -> Tokenizer:
    if family.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=family.unk))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=500, special_tokens=list(family.specials))
        tok.decoder = decoders.WordPiece()
    elif family.kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=family.unk))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=list(family.specials),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.decoder = decoders.ByteLevel()
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=500, special_tokens=list(family.specials), unk_token=family.unk)
        tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(_corpus(family.words), trainer)
    return tok


def build_tiny_model(arch: str, task: TaskName, directory: Path, seed: int = 0, *,
                     shape: dict | None = None) -> Path:
    """Write config, safetensors weights and tokenizer files of a tiny ``arch`` model for ``task``. ``shape``:
    config values that replace the tiny ones (a real model's sizes, for benchmarks); such a model keeps
    transformers' own initialisation, which deep stacks need, and the family's small tokenizer."""
    if task == TaskName.MULTI_VECTOR:  # a ColBERT: the encoder plus a projection, in PyLate's layout
        if arch != "bert":
            raise ValueError(f"a tiny ColBERT is built on bert, not {arch}")
        return build_tiny_colbert(directory, seed=seed)
    if task == TaskName.HYBRID_EMBEDDING:  # BGE-M3's layout: the encoder, its heads beside it
        return build_tiny_bge_m3(directory, arch, seed=seed, shape=shape)
    family, config_class, kwargs = ARCHITECTURES[arch]
    kwargs = {**kwargs, **(shape or {})}
    max_len = BENCHMARK_LENGTH if shape else family.max_length
    tok = train_tokenizer(family)
    names = ["input_ids", "token_type_ids", "attention_mask"] if family.type_ids else ["input_ids", "attention_mask"]
    if family.eos_only:  # Qwen's: pads with <|endoftext|>, which also ends every text
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token=family.pad, eos_token=family.sep, unk_token=family.unk,
            model_input_names=names, model_max_length=max_len)
    elif family.bos_only:  # Llama 3's: opens texts with its BOS, ends generation with its EOS, no padding token
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=family.cls, eos_token=family.sep, unk_token=family.unk,
            model_input_names=names, model_max_length=max_len)
    elif family.template:
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token=family.pad, unk_token=family.unk, cls_token=family.cls,
            sep_token=family.sep, mask_token=family.mask, model_input_names=names,
            model_max_length=max_len,
        )
    else:  # GPT-2's: bos = eos = unk = <|endoftext|>, no padding token
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=family.cls, eos_token=family.sep, unk_token=family.unk,
            model_input_names=names, model_max_length=max_len)
    labels = LABELS.get(task, ["relevance"] if task == TaskName.TEXT_RANKING else [])
    special_ids = {"cls_token_id": tok.token_to_id(family.cls), "sep_token_id": tok.token_to_id(family.sep),
                   "bos_token_id": tok.token_to_id(family.cls), "eos_token_id": tok.token_to_id(family.sep)} \
        if arch == "modernbert" else {}
    if not family.template:  # a decoder: no padding token; begins and ends texts with <|endoftext|>
        eos = tok.token_to_id(family.sep)
        special_ids = {"bos_token_id": eos, "eos_token_id": eos}
    elif family.eos_only:
        special_ids = {"eos_token_id": tok.token_to_id(family.sep)}
    elif family.bos_only:
        special_ids = {"bos_token_id": tok.token_to_id(family.cls), "eos_token_id": tok.token_to_id(family.sep)}
    pad = tok.token_to_id(family.pad) if family.template and not family.bos_only else None
    config = config_class(**{"vocab_size": tok.get_vocab_size(), **kwargs}, pad_token_id=pad,
                          **special_ids,
                          **({"id2label": dict(enumerate(labels)), "label2id": {v: i for i, v in enumerate(labels)}}
                             if labels else {}))
    torch.manual_seed(seed)
    auto = getattr(transformers, task_spec(task).export.auto_class)  # the class the task itself loads with
    model = auto.from_config(config).eval()
    with torch.no_grad():  # larger random weights so outputs are not all near-uniform
        for param in model.parameters():
            if param.dim() > 1 and shape is None:
                param.normal_(0, 0.2)
    model.save_pretrained(directory, safe_serialization=True)
    if task == TaskName.TEXT_GENERATION and arch in CHAT_TEMPLATES:
        fast.chat_template = CHAT_TEMPLATES[arch]
    fast.save_pretrained(directory)
    return directory


COLBERT_PREFIXES = ("[Q] ", "[D] ")  # PyLate's default markers, added to the tokenizer as it adds them


def build_tiny_colbert(directory: Path, dims: int = 16, *, query_length: int = 16, document_length: int = 48,
                       seed: int = 0) -> Path:
    """A tiny ColBERT in PyLate's layout (what PyLate's ``ColBERT(...).save`` writes): a tiny BERT whose tokenizer
    has the query/document markers as added tokens (embeddings resized), a bias-free ``1_Dense`` projection from
    the hidden size to ``dims``, and config_sentence_transformers.json with the markers, lengths, query expansion
    and the punctuation skiplist."""
    import json
    import string

    from safetensors.torch import save_file

    build_tiny_model("bert", TaskName.FEATURE_EXTRACTION, directory, seed=seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer.add_tokens(list(COLBERT_PREFIXES))
    model = transformers.AutoModel.from_pretrained(directory)
    torch.manual_seed(seed + 1)  # resizing draws the new rows at random; they are then set from this seed too
    model.resize_token_embeddings(len(tokenizer))
    with torch.no_grad():  # the resized rows are random but small; make the markers matter as much as any token
        model.embeddings.word_embeddings.weight[-len(COLBERT_PREFIXES):].normal_(0, 0.2)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    dense = directory / "1_Dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({
        "in_features": model.config.hidden_size, "out_features": dims, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}))
    save_file({"linear.weight": torch.randn(dims, model.config.hidden_size) * 0.3}, str(dense / "model.safetensors"))
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": document_length - 1,
                                                                     "do_lower_case": False}))
    (directory / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
        "similarity_fn_name": "MaxSim", "query_prefix": COLBERT_PREFIXES[0], "document_prefix": COLBERT_PREFIXES[1],
        "query_length": query_length, "document_length": document_length, "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation), "do_query_expansion": True}))
    return directory


def build_tiny_colbert_ai(directory: Path, dims: int = 16, *, query_length: int = 16, document_length: int = 48,
                          seed: int = 0) -> Path:
    """A tiny ColBERT in the original ColBERT's (``colbert-ai``) checkpoint layout, what its ``HF_ColBERT``
    ``save_pretrained`` writes: one weights file holding the encoder under ``bert.`` and the bias-free projection
    as ``linear.weight``, config.json naming ``HF_ColBERT``, and ``artifact.metadata`` (its ColBERTConfig) with the
    lengths, the projection size and the ``[unused0]``/``[unused1]`` markers (in a real BERT vocabulary; added to the
    tiny one here)."""
    import json

    from safetensors.torch import save_file

    build_tiny_model("bert", TaskName.FEATURE_EXTRACTION, directory, seed=seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer.add_tokens(["[unused0]", "[unused1]"])
    model = transformers.AutoModel.from_pretrained(directory)
    torch.manual_seed(seed + 1)
    model.resize_token_embeddings(len(tokenizer))
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[-2:].normal_(0, 0.2)
    state = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
    state["linear.weight"] = torch.randn(dims, model.config.hidden_size) * 0.3
    for stale in directory.glob("*.safetensors"):
        stale.unlink()
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["HF_ColBERT"],
                                                       "vocab_size": len(tokenizer)}))
    tokenizer.save_pretrained(directory)
    # as colbert-ai's checkpoints name it (written by transformers 4, which colbert-ai 0.2.22 needs)
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config,
                                                                 "tokenizer_class": "BertTokenizerFast"}))
    (directory / "artifact.metadata").write_text(json.dumps({
        "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_token": "[Q]", "doc_token": "[D]",
        "dim": dims, "query_maxlen": query_length, "doc_maxlen": document_length, "mask_punctuation": True,
        "attend_to_mask_tokens": False, "similarity": "cosine", "checkpoint": "bert-base-uncased",
        "meta": {"version": "colbert-v0.4"}}, indent=4))
    return directory


def write_sentence_transformers_files(directory: Path, *, pooling: str = "mean", normalize: bool = True,
                                      prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                                      include_prompt: bool = True, dense: tuple[int, ...] = (),
                                      seed: int = 0) -> Path:
    """Make ``directory`` (a model from :func:`build_tiny_model`) a sentence-transformers model: Transformer,
    Pooling (``pooling``: mean, cls, max or lasttoken), a bias-free Dense projection to each size in ``dense``
    (EmbeddingGemma's 768 -> 3072 -> 768), Normalize, and its prompts as config_sentence_transformers.json holds
    them (nomic-embed's ``search_query: `` and the like)."""
    from safetensors.torch import save_file

    config = json.loads((directory / "config.json").read_text())
    width = config.get("hidden_size", config.get("dim"))
    mode = {"cls": "pooling_mode_cls_token", "lasttoken": "pooling_mode_lasttoken"}.get(pooling,
                                                                                       f"pooling_mode_{pooling}_tokens")
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": width, mode: True, "include_prompt": include_prompt}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    torch.manual_seed(seed + 2)
    for size in dense:
        idx = len(modules)
        (directory / f"{idx}_Dense").mkdir(exist_ok=True)
        (directory / f"{idx}_Dense" / "config.json").write_text(json.dumps({
            "in_features": width, "out_features": size, "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}))
        save_file({"linear.weight": torch.randn(size, width) / width**0.5},
                  str(directory / f"{idx}_Dense" / "model.safetensors"))
        modules.append({"idx": idx, "name": str(idx), "path": f"{idx}_Dense",
                        "type": "sentence_transformers.models.Dense"})
        width = size
    if normalize:
        idx = len(modules)
        modules.append({"idx": idx, "name": str(idx), "path": f"{idx}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (directory / f"{idx}_Normalize").mkdir(exist_ok=True)
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts or {}, "default_prompt_name": default_prompt_name, "similarity_fn_name": "cosine"}))
    return directory


def build_tiny_bge_m3(directory: Path, arch: str = "xlm-roberta", seed: int = 0, *, shape: dict | None = None,
                      colbert_dim: int | None = None) -> Path:
    """A tiny BGE-M3 as FlagEmbedding saves it: an encoder (XLM-R for the real one) with sentence-transformers files
    (CLS pooling, Normalize), ``sparse_linear.pt`` (hidden -> 1, with bias) and ``colbert_linear.pt`` (hidden ->
    ``colbert_dim``, the hidden size by default as in BGE-M3), each a ``torch.save``d state dict."""
    build_tiny_model(arch, TaskName.FEATURE_EXTRACTION, directory, seed=seed, shape=shape)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer.eos_token = tokenizer.sep_token  # XLM-R's </s> is both; FlagEmbedding never weighs the EOS token
    tokenizer.save_pretrained(directory)
    write_sentence_transformers_files(directory, pooling="cls", normalize=True, seed=seed)
    hidden = json.loads((directory / "config.json").read_text())["hidden_size"]
    torch.manual_seed(seed + 3)
    sparse = torch.nn.Linear(hidden, 1)
    colbert = torch.nn.Linear(hidden, colbert_dim or hidden)
    with torch.no_grad():  # weights of the scale training leaves, so about half the tokens weigh above zero
        sparse.weight.normal_(0, hidden**-0.5)
        sparse.bias.fill_(0.05)
    torch.save(sparse.state_dict(), directory / "sparse_linear.pt")
    torch.save(colbert.state_dict(), directory / "colbert_linear.pt")
    return directory


JINA_ADAPTERS = ("retrieval.query", "retrieval.passage", "separation", "classification", "text-matching")
JINA_PROMPTS = {"retrieval.query": "Represent the query for retrieving evidence documents: ",
                "retrieval.passage": "Represent the document for retrieval: ", "separation": "",
                "classification": "", "text-matching": ""}


def build_tiny_jina_v3(directory: Path, seed: int = 0, *, rank: int = 4,
                       alpha: float = 1.0) -> dict[str, dict[str, torch.Tensor]]:
    """A tiny jina-embeddings-v3 as Jina's own code saves it (``XLMRobertaLoRA``, model_type xlm-roberta with
    rotary positions and an auto_map): Jina's weight names (``roberta.encoder.layers.N.mixer.Wqkv``...), every
    Linear and Embedding weight as a parametrization's ``original`` beside its ``lora_A`` / ``lora_B`` stacked over
    the five task adapters, its sentence-transformers files (mean pooling, Normalize, the tasks' prompts).

    Returns what each adapter adds to each weight of transformers' ``JinaEmbeddingsV3Model`` (its parameter names;
    Jina's formula ``lora_B @ lora_A * alpha / rank``, an Embedding's the other way round), for a test's reference."""
    from safetensors.torch import save_file

    native = directory / "native"
    build_tiny_model("jina_embeddings_v3", TaskName.FEATURE_EXTRACTION, native, seed=seed)
    weights = transformers.JinaEmbeddingsV3Model.from_pretrained(native).state_dict()
    config = json.loads((native / "config.json").read_text())
    layers = range(config["num_hidden_layers"])
    jina: dict[str, torch.Tensor] = {
        "roberta.embeddings.word_embeddings.weight": weights["embeddings.word_embeddings.weight"],
        "roberta.embeddings.token_type_embeddings.weight": weights["embeddings.token_type_embeddings.weight"],
        "roberta.emb_ln.weight": weights["embeddings.LayerNorm.weight"],
        "roberta.emb_ln.bias": weights["embeddings.LayerNorm.bias"],
        "roberta.pooler.dense.weight": weights["pooler.dense.weight"],
        "roberta.pooler.dense.bias": weights["pooler.dense.bias"],
    }
    parts = {"mixer.out_proj": "self_attn.o_proj", "norm1": "post_attention_layernorm", "mlp.fc1": "mlp.fc1",
             "mlp.fc2": "mlp.fc2", "norm2": "post_mlp_layernorm"}
    for i in layers:
        ours, theirs = f"roberta.encoder.layers.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            jina[f"{ours}mixer.Wqkv.{kind}"] = torch.cat([weights[f"{theirs}self_attn.{p}_proj.{kind}"]
                                                          for p in "qkv"])
            for jina_name, native_name in parts.items():
                jina[f"{ours}{jina_name}.{kind}"] = weights[f"{theirs}{native_name}.{kind}"]
    # the native names each Jina weight's update lands in (Wqkv's splits into three equal row blocks)
    lands = {"roberta.embeddings.word_embeddings.weight": ["embeddings.word_embeddings.weight"],
             "roberta.embeddings.token_type_embeddings.weight": ["embeddings.token_type_embeddings.weight"],
             "roberta.pooler.dense.weight": ["pooler.dense.weight"]}
    for i in layers:
        lands[f"roberta.encoder.layers.{i}.mixer.Wqkv.weight"] = [f"layers.{i}.self_attn.{p}_proj.weight"
                                                                  for p in "qkv"]
        for jina_name in ("mixer.out_proj", "mlp.fc1", "mlp.fc2"):
            lands[f"roberta.encoder.layers.{i}.{jina_name}.weight"] = [f"layers.{i}.{parts[jina_name]}.weight"]
    torch.manual_seed(seed + 5)
    count, deltas = len(JINA_ADAPTERS), {name: {} for name in JINA_ADAPTERS}
    for key, targets in lands.items():
        weight, stem = jina.pop(key), key.removesuffix(".weight")
        rows, cols = weight.shape
        embedding = "embeddings" in key
        a = torch.randn(count, rows, rank) * 0.2 if embedding else torch.randn(count, rank, cols) * 0.2
        b = torch.randn(count, rank, cols) * 0.2 if embedding else torch.randn(count, rows, rank) * 0.2
        jina[f"{stem}.parametrizations.weight.original"] = weight
        jina[f"{stem}.parametrizations.weight.0.lora_A"], jina[f"{stem}.parametrizations.weight.0.lora_B"] = a, b
        for index, name in enumerate(JINA_ADAPTERS):
            update = (a[index] @ b[index] if embedding else b[index] @ a[index]) * alpha / rank
            for target, block in zip(targets, update.chunk(len(targets))):
                deltas[name][target] = block
    save_file({k: v.contiguous() for k, v in jina.items()}, str(directory / "model.safetensors"))
    shared = {k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                      "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
                                      "initializer_range", "layer_norm_eps", "pad_token_id", "bos_token_id",
                                      "eos_token_id")}
    (directory / "config.json").write_text(json.dumps({
        **shared, "model_type": "xlm-roberta", "architectures": ["XLMRobertaLoRA"],
        "auto_map": {"AutoConfig": "jinaai/xlm-roberta-flash-implementation--configuration_xlm_roberta."
                                   "XLMRobertaFlashConfig",
                     "AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA"},
        "position_embedding_type": "rotary", "rotary_emb_base": config["rope_parameters"]["rope_theta"],
        "lora_adaptations": list(JINA_ADAPTERS), "lora_rank": rank, "lora_alpha": alpha, "lora_dropout_p": 0.0,
        "task_instructions": JINA_PROMPTS, "use_flash_attn": True, "torch_dtype": "float32"}, indent=2))
    for path in native.iterdir():  # the tokenizer files; the native config and weights stay behind
        if path.name not in {"config.json", "model.safetensors"}:
            path.rename(directory / path.name)
    write_sentence_transformers_files(directory, pooling="mean", normalize=True, prompts=JINA_PROMPTS, seed=seed)
    modules = json.loads((directory / "modules.json").read_text())
    modules[0]["type"] = "custom_st.Transformer"  # Jina's own sentence-transformers module
    (directory / "modules.json").write_text(json.dumps(modules))
    native.joinpath("config.json").unlink()
    native.joinpath("model.safetensors").unlink()
    native.rmdir()
    return deltas


# Qwen3-Reranker's prompt (its model card's format) as a chat template that renders sentence-transformers' "query"
# and "document" roles, the way CrossEncoder reads a causal reranker; a "system" message replaces the instruction.
QWEN3_RERANKER_TEMPLATE = """\
{%- set query = messages | selectattr("role", "eq", "query") | map(attribute="content") | first -%}
{%- set document = messages | selectattr("role", "eq", "document") | map(attribute="content") | first -%}
{%- set instruction = messages | selectattr("role", "eq", "system") | map(attribute="content") | first
    | default("Given a web search query, retrieve relevant passages that answer the query", true) -%}
<|im_start|>system
Judge whether the Document meets the requirements based on the Query and the Instruct provided. \
Note that the answer can only be "yes" or "no".<|im_end|>
<|im_start|>user
<Instruct>: {{ instruction }}
<Query>: {{ query }}
<Document>: {{ document }}<|im_end|>
<|im_start|>assistant
<think>

</think>

{# the line above ends the prompt with two newlines, as the model card's suffix does #}"""


def build_tiny_causal_reranker(directory: Path, seed: int = 0) -> Path:
    """A tiny Qwen3-Reranker: a Qwen3 language model (tied embeddings, "yes" and "no" single tokens) with the
    reranker's prompt as its chat template (chat_template.jinja)."""
    build_tiny_model("qwen3", TaskName.TEXT_GENERATION, directory, seed=seed)
    (directory / "chat_template.jinja").write_text(QWEN3_RERANKER_TEMPLATE)
    return directory
