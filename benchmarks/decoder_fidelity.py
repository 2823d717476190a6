"""int8 and int4 fidelity of a decoder that has learned something: random weights (benchmarks/decoder_latency.py)
make next-token agreement say little, and no checkpoint can be downloaded here, so a small GPT-2 (``--arch gpt2``)
or Llama-shaped model (``--arch llama``: grouped-query attention, RMSNorm, SwiGLU, rotary positions, tied
embeddings as SmolLM's) is trained on text that ships with Python, then ``kiln optimize`` builds and gates its
variants (int4 weights among a decoder's defaults).

Training text: the calibration half of the Python reference manual (``kiln.data.corpus``) and the standard
library's docstrings. kiln validates on the other, held-out half of the manual (agreement and perplexity), which
training never sees. A byte-level BPE of 8,192 tokens is trained on the same text.

    python benchmarks/decoder_fidelity.py [--arch llama] [--minutes 12] [--layers 4] [--width 256] [--keep DIR]

``--keep DIR`` leaves the trained model (DIR/model) and kiln optimize's output (DIR/opt) for
``benchmarks/decoder_peers.py DIR/model DIR/opt``.

-> benchmarks/decoder_fidelity.json (training curve, held-out perplexity, kiln optimize's per-variant figures) and
benchmarks/decoder_fidelity.summary.md (kiln optimize's summary).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree

VOCAB = 8192
WINDOW = 256


def training_text() -> list[str]:
    from kiln.data.corpus import paragraphs
    from kiln.data.docstrings import docstring_sentences

    return [*paragraphs("calibration"), *docstring_sentences()]


def build_tokenizer(texts: list[str], directory: Path):
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                                eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                                model_max_length=WINDOW)
    fast.save_pretrained(directory)
    return fast


def token_stream(tokenizer, texts: list[str]):
    import numpy as np

    eos = tokenizer.eos_token_id
    ids = [i for text in texts for i in (*tokenizer(text)["input_ids"], eos)]
    return np.array(ids, dtype=np.int64)


def model_config(arch: str, layers: int, width: int, eos: int):
    """The architecture's config at this size: GPT-2's, or Llama's with heads of 64 and half as many key/value
    heads (grouped-query attention) and SwiGLU's 8/3 width rounded to 64."""
    import transformers

    heads = max(1, width // 64)
    if arch == "llama":
        return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=width, num_hidden_layers=layers,
                                        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                                        head_dim=width // heads, intermediate_size=-(-8 * width // 3 // 64) * 64,
                                        max_position_embeddings=WINDOW, tie_word_embeddings=True,
                                        bos_token_id=eos, eos_token_id=eos)
    return transformers.GPT2Config(vocab_size=VOCAB, n_positions=WINDOW, n_embd=width, n_layer=layers,
                                   n_head=heads, bos_token_id=eos, eos_token_id=eos)


def train(directory: Path, minutes: float, layers: int, width: int, seed: int = 0, arch: str = "gpt2") -> dict:
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(seed)
    texts = training_text()
    tokenizer = build_tokenizer(texts, directory)
    stream = token_stream(tokenizer, texts)
    model = transformers.AutoModelForCausalLM.from_config(model_config(arch, layers, width, tokenizer.eos_token_id))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    batch, length = 16, 128
    curve, step, start = [], 0, time.perf_counter()
    model.train()
    while time.perf_counter() - start < minutes * 60:
        offsets = rng.integers(0, len(stream) - length - 1, batch)
        x = torch.from_numpy(np.stack([stream[o : o + length] for o in offsets]))
        lr = 1e-3 * min(1.0, (step + 1) / 100)  # warm-up, then constant: the run is cut by time, not steps
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0:
            seconds = round(time.perf_counter() - start, 1)
            curve.append({"step": step, "seconds": seconds, "loss": round(loss.item(), 3)})
            print(curve[-1], flush=True)
        step += 1
    model.eval().save_pretrained(directory, safe_serialization=True)
    return {"steps": step, "tokens_seen": step * batch * length, "training_tokens": int(len(stream)),
            "parameters": sum(p.numel() for p in model.parameters()), "arch": arch, "layers": layers, "width": width,
            "curve": curve, "final_train_loss": curve[-1]["loss"] if curve else None,
            "final_train_perplexity": round(math.exp(curve[-1]["loss"]), 1) if curve else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--minutes", type=float, default=12)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--json", "--output", dest="output", type=Path, default=OUT / "decoder_fidelity.json")
    parser.add_argument("--keep", type=Path, help="keep the trained model and the optimize output here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        model_dir = root / "model"
        trained = train(model_dir, args.minutes, args.layers, args.width, arch=args.arch)
        opt = root / "opt"
        subprocess.run([sys.executable, "-m", "kiln", "optimize", str(model_dir), "--task", "text-generation",
                        "-o", str(opt)], check=True)
        results = json.loads((opt / "results.json").read_text())
        shutil.copy(opt / "summary.md", args.output.with_suffix(".summary.md"))
    out = {"command": "python " + " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
           "model": trained, "optimize": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
