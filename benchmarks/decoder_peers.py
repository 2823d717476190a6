"""kiln's decoder variants against the tools a user would pick instead, on the same weights.

Configurations (each in a fresh process; the peers in their own venv, ``--venv``, created on first use):
  * transformers ``generate``, PyTorch fp32, and bf16 where the CPU has it (kiln's venv);
  * GPT-2 and GPT-Neo: optimum-intel ``OVModelForCausalLM`` (int8 weights), CTranslate2 on its own int8 conversion,
    ONNX Runtime GenAI running kiln's own exported step graph with a ``genai_config.json`` written here;
  * Llama family (Llama, Qwen3): OpenVINO GenAI's ``LLMPipeline`` on optimum-cli's int4 and int8 weight exports,
    ONNX Runtime GenAI on its own model builder's int4 and fp32 graphs, and llama.cpp (llama-cpp-python, built
    here) on Q4_K_M and Q8_0 files from llama.cpp's own converter and quantizer;
  * kiln's variants from a ``kiln optimize`` output (``kiln.decoder.generate.stream`` on token ids).

Per configuration, greedy decoding of prompts of ``--lengths`` tokens (128 and 512 by default) at batch 1 and 4:
time to first token (a 1-token call, median of 3) and per-token latency ((64-token call - first token) / 63).
llama-cpp-python's ``Llama`` decodes one sequence at a time: its batch-4 rows are four sequences in turn. Prompts
are random token ids, or ``--prompts text``: held-out paragraphs of the Python manual, with 32 more such prompts
generated (in fours, untimed) for a trained model's agreement. The tokens of every configuration are compared with
transformers fp32's up to its first EOS (what a user sees): equal precision must mean equal tokens; lower precision
costs the agreement it reports.

    python benchmarks/decoder_peers.py MODEL_DIR KILN_OPTIMIZE_OUT [--threads 2] [--rounds 5] [--json out.json]
    python benchmarks/decoder_peers.py MODEL_DIR OUT --shape smollm2-135m --lengths 128,1024   # builds both first

One pass of a configuration moved its per-token latency by up to 20% on a 2-core VM; ``--rounds N`` runs the
configurations N times, alternated, and reports each cell's median with the passes beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree

HERE = Path(__file__).resolve().parent
NEW = 64
PEER_PACKAGES = ["torch==2.13.0", "transformers==4.57.1", "optimum-intel[openvino,nncf]==2.2.0", "ctranslate2==4.8.5",
                 "onnxruntime-genai==0.18.0", "openvino-genai==2026.4.1.0", "openvino-tokenizers==2026.4.1.0",
                 "llama-cpp-python==0.3.36", "sentencepiece"]
# ONNX Runtime GenAI's model builder imports transformers 5's classes; optimum-intel 2.2 needs transformers 4.
GENAI_PACKAGES = ["torch==2.13.0", "transformers==5.23.0", "onnxruntime-genai==0.18.0", "onnx_ir", "onnx"]
LLAMA_FAMILY = ("llama", "qwen3", "qwen2", "gemma3_text")
AGREEMENT, AGREEMENT_PROMPTS = "agreement", 32  # --prompts text: held-out prompts judged, not timed
# Real models' shapes with random weights (build_tiny_model's ``shape``): latency does not depend on the values.
BUILD_SHAPES = {"smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30,
                                               num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                               intermediate_size=1536, max_position_embeddings=2048,
                                               rope_theta=100000.0, tie_word_embeddings=True))}
# kiln's variants built for the peers' precisions (a decoder's defaults add onnx-fp32/int8 and openvino-fp32).
LLAMA_VARIANTS = "onnx-fused,onnx-int4-weights,openvino-int8-weights,openvino-int4-weights"


def prompts(kind: str, lengths: list[int], tokenizer_dir: str) -> dict[str, list[list[int]]]:
    """Per shape ("BxN"), ``B`` prompts of ``N`` token ids: random ids, or (``kind="text"``) consecutive windows of
    the Python manual's held-out paragraphs in the model's tokenizer, which a model trained on the calibration half
    (benchmarks/decoder_fidelity.py) never saw. Written once by the orchestrator, read by every worker."""
    import numpy as np

    stream: list[int] = []
    if kind == "text":
        import tokenizers

        from kiln.data.corpus import paragraphs

        tok = tokenizers.Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        stream = [i for text in paragraphs("held-out") for i in tok.encode(text).ids]
    out = {}
    for length in lengths:
        for batch in (1, 4):
            if stream:
                out[f"{batch}x{length}"] = [stream[k * length:(k + 1) * length] for k in range(batch)]
            else:
                out[f"{batch}x{length}"] = np.random.default_rng(length).integers(100, 1000, (batch, length)).tolist()
    if stream:  # the agreement set: AGREEMENT_PROMPTS further windows, generated in fours and not timed
        length, start = lengths[0], 8 * lengths[0]
        out[AGREEMENT] = [stream[start + k * length:start + (k + 1) * length] for k in range(AGREEMENT_PROMPTS)]
    return out


def measure(generate) -> dict:
    """``generate(ids, new) -> list of token lists`` timed over the orchestrator's prompts (the agreement set's
    tokens only kept)."""
    shapes = json.loads(Path(os.environ["KILN_PEER_PROMPT_FILE"]).read_text())
    agreement = shapes.pop(AGREEMENT, [])
    rows, tokens = [], {}
    first = next(iter(shapes.values()))
    generate([first[0][:8]], 2)  # warm-up
    for shape, ids in shapes.items():
        batch, length = len(ids), len(ids[0])
        firsts = []
        for _ in range(3):
            start = time.perf_counter()
            generate(ids, 1)
            firsts.append(time.perf_counter() - start)
        start = time.perf_counter()
        out = generate(ids, NEW)
        whole = time.perf_counter() - start
        first = statistics.median(firsts)
        rows.append({"batch": batch, "prompt": length, "first_token_ms": round(1000 * first, 1),
                     "per_token_ms": round(1000 * (whole - first) / (NEW - 1), 2)})
        tokens[shape] = [list(map(int, o))[:NEW] for o in out]
        print(rows[-1], file=sys.stderr, flush=True)
    if agreement:
        tokens[AGREEMENT] = [list(map(int, o))[:NEW] for k in range(0, len(agreement), 4)
                             for o in generate(agreement[k:k + 4], NEW)]
    return {"rows": rows, "tokens": tokens}


# -- workers -----------------------------------------------------------------------------------------------------
def transformers_worker(model_dir: str, dtype: str, threads: int):
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None  # every configuration generates all 64 tokens

    def generate(ids, new):
        x = torch.tensor(ids)
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
                                 pad_token_id=0)
        return out[:, x.shape[1]:].tolist()

    return generate


def optimum_worker(model_dir: str, threads: int):
    import torch
    from optimum.intel import OVModelForCausalLM

    model = OVModelForCausalLM.from_pretrained(model_dir, export=True, load_in_8bit=True, compile=True,
                                               ov_config={"INFERENCE_NUM_THREADS": str(threads),
                                                          "PERFORMANCE_HINT": "LATENCY"})
    model.generation_config.eos_token_id = None

    def generate(ids, new):
        x = torch.tensor(ids)
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
                             pad_token_id=0)
        return out[:, x.shape[1]:].tolist()

    return generate


def _with_id_vocabulary(model_dir: str) -> str:
    """The model directory with a tokenizer of one token per id ("<0>" ... "<50256>"): CTranslate2 takes its
    vocabulary from the tokenizer and needs one entry per logit, and the benchmark's tokenizer is a small BPE
    beside a 50,257-row model (random weights, token ids in and out). Ids map to themselves either way."""
    import tokenizers
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    size, eos = config.vocab_size, f"<{config.eos_token_id}>"
    copy = _linked_copy(model_dir, lambda name: name.startswith("tokenizer") or name == "special_tokens_map.json")
    vocab = {f"<{i}>": i for i in range(size)}
    tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<0>")).save(str(copy / "tokenizer.json"))
    (copy / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "bos_token": eos, "eos_token": eos, "unk_token": "<0>"}))
    return str(copy)


def _linked_copy(model_dir: str, replaced) -> Path:
    """A scratch directory of links to ``model_dir``'s files, but those ``replaced(name)`` names (the caller writes
    its own)."""
    copy = Path(tempfile.mkdtemp(prefix="peer-model-"))
    for item in Path(model_dir).iterdir():
        if not replaced(item.name):
            os.symlink(item, copy / item.name)
    return copy


def ct2_worker(model_dir: str, threads: int):
    import ctranslate2
    import tokenizers

    out = Path(tempfile.mkdtemp(prefix="ct2-"))
    ids_dir = _with_id_vocabulary(model_dir)
    ctranslate2.converters.TransformersConverter(ids_dir).convert(str(out), quantization="int8", force=True)
    generator = ctranslate2.Generator(str(out), device="cpu", compute_type="int8", intra_threads=threads)
    tokenizer = tokenizers.Tokenizer.from_file(str(Path(ids_dir) / "tokenizer.json"))

    def generate(ids, new):
        tokens = [[tokenizer.id_to_token(i) for i in row] for row in ids]
        results = generator.generate_batch(tokens, max_length=new, sampling_topk=1, include_prompt_in_result=False,
                                           end_token=[], min_length=new)
        return [r.sequences_ids[0] for r in results]

    return generate


# ORT GenAI's "gpt2" type is its legacy GPT model (one combined past tensor per layer); kiln's step graph has a key
# and a value input per layer, which its decoder-only types read (phi-2's names are the same as kiln's).
GENAI_TYPE = os.environ.get("KILN_GENAI_TYPE", "phi")


def genai_worker(variant_dir: str, model_dir: str, threads: int):
    import onnxruntime_genai as og
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    work = Path(tempfile.mkdtemp(prefix="genai-"))
    onnx_files = [p for p in Path(variant_dir).iterdir() if p.suffix in (".onnx", ".data")]
    for p in onnx_files:
        os.symlink(p, work / p.name)
    graph = next(p.name for p in onnx_files if p.suffix == ".onnx")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(model_dir) / name).is_file():
            shutil.copy(Path(model_dir) / name, work / name)
    heads = config.num_attention_heads
    (work / "genai_config.json").write_text(json.dumps({"model": {
        "type": GENAI_TYPE, "vocab_size": config.vocab_size, "context_length": config.n_positions,
        "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id, "pad_token_id": 0,
        "decoder": {"filename": graph, "head_size": config.n_embd // heads, "hidden_size": config.n_embd,
                    "num_attention_heads": heads, "num_key_value_heads": heads, "num_hidden_layers": config.n_layer,
                    "session_options": {"intra_op_num_threads": threads, "log_id": "kiln", "provider_options": []},
                    "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                               "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                               "past_value_names": "past_key_values.%d.value"},
                    "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                "present_value_names": "present.%d.value"}}},
        "search": {"do_sample": False, "max_length": config.n_positions, "num_beams": 1, "min_length": 0,
                   "past_present_share_buffer": False}}))
    return _genai_generate(og, og.Model(str(work)))


def _genai_generate(og, model):
    def generate(ids, new):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids[0]) + new, min_length=len(ids[0]) + new, do_sample=False,
                                  batch_size=len(ids))
        generator = og.Generator(model, params)
        generator.append_tokens([list(row) for row in ids])
        out = [[] for _ in ids]
        while not generator.is_done():
            generator.generate_next_token()
            for i, t in enumerate(generator.get_next_tokens()):
                out[i].append(int(t))
        return out

    return generate


def ov_genai_worker(model_dir: str, weights: str, threads: int):
    """OpenVINO GenAI's LLMPipeline on optimum-cli's export with ``--weight-format`` int4 or int8 (its defaults
    for the rest: what a user of ``optimum-cli export openvino`` gets)."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    out = Path(tempfile.mkdtemp(prefix=f"ov-{weights}-"))
    cli = Path(sys.executable).parent / "optimum-cli"
    # int4 in groups of 64 input channels: NNCF refuses its default 128 where a width is no multiple of it
    # (SmolLM2-135M's 576; the trained model's 704), as kiln's openvino-int4-weights falls back to 64.
    group = ["--group-size", "64"] if weights == "int4" else []
    subprocess.run([str(cli), "export", "openvino", "-m", model_dir, "--task", "text-generation-with-past",
                    "--weight-format", weights, *group, str(out)], check=True, stdout=sys.stderr)
    # Without prefix caching (its scheduler's default here reused the prompt's cache across the timed calls of one
    # prompt: a 1,024-token batch of 4 "prefilled" in 82 ms).
    scheduler = openvino_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    pipe = openvino_genai.LLMPipeline(str(out), "CPU", scheduler_config=scheduler, INFERENCE_NUM_THREADS=threads)

    def generate(ids, new):
        config = openvino_genai.GenerationConfig(max_new_tokens=new, min_new_tokens=new, ignore_eos=True,
                                                 do_sample=False)
        x = np.array(ids, dtype=np.int64)
        inputs = openvino_genai.TokenizedInputs(ov.Tensor(x), ov.Tensor(np.ones_like(x)))
        return [list(t) for t in pipe.generate(inputs, config).tokens]

    return generate


def genai_builder_worker(model_dir: str, precision: str, threads: int):
    """ONNX Runtime GenAI on the graph its own model builder makes from the checkpoint (``-p int4`` or ``fp32``
    for the CPU): what a user of ORT GenAI runs, not kiln's graph."""
    import onnxruntime_genai as og

    out = Path(tempfile.mkdtemp(prefix=f"genai-{precision}-"))
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", model_dir, "-o", str(out),
                    "-p", precision, "-e", "cpu", "-c", str(out / "cache")], check=True, stdout=sys.stderr)
    config = json.loads((out / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    (out / "genai_config.json").write_text(json.dumps(config))
    return _genai_generate(og, og.Model(str(out)))


LLAMA_CPP_FTYPES = {"Q4_K_M": 15, "Q8_0": 7}  # llama.h's LLAMA_FTYPE_MOSTLY_*


def llama_cpp_worker(model_dir: str, quant: str, threads: int):
    """llama.cpp through llama-cpp-python: the checkpoint through llama.cpp's own converter (convert_hf_to_gguf.py,
    from llama-cpp-python's source distribution) to f32, then its quantizer to ``quant``. A tokenizer the converter
    does not know by hash is declared GPT-2's pre-tokenizer (the trained model's byte-level BPE is; token ids go in
    and out here either way)."""
    import llama_cpp

    out = Path(tempfile.mkdtemp(prefix="gguf-"))
    source = _llama_cpp_source()
    model_dir = _for_transformers_4(model_dir)
    f32, quantized = out / "model-f32.gguf", out / f"model-{quant}.gguf"
    convert = (f"import sys; sys.path[:0] = [{str(source)!r}, {str(source / 'gguf-py')!r}]; "
               "from conversion.base import TextModel; import convert_hf_to_gguf as c; "
               "TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'; "
               f"sys.argv = ['convert', {model_dir!r}, '--outfile', {str(f32)!r}, '--outtype', 'f32']; c.main()")
    subprocess.run([sys.executable, "-c", convert], check=True, stdout=sys.stderr)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_CPP_FTYPES[quant]
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(f32).encode(), str(quantized).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize to {quant}")
    llm = llama_cpp.Llama(str(quantized), n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads,
                          verbose=False)

    def generate(ids, new):
        rows = []
        for row in ids:  # one sequence at a time: the Llama class has no batched generation
            llm.reset()
            tokens = []
            for token in llm.generate(row, top_k=1, top_p=1.0, temp=0.0, reset=True):
                tokens.append(int(token))
                if len(tokens) == new:
                    break
            rows.append(tokens)
        return rows

    return generate


def _for_transformers_4(model_dir: str) -> str:
    """The model directory as transformers 4 reads it (the converter loads its tokenizer): a tokenizer saved by
    transformers 5 names its class TokenizersBackend, which transformers 4 calls PreTrainedTokenizerFast."""
    config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    if config.get("tokenizer_class") != "TokenizersBackend":
        return model_dir
    copy = _linked_copy(model_dir, lambda name: name == "tokenizer_config.json")
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return str(copy)


def _llama_cpp_source() -> Path:
    """llama.cpp's converter and gguf-py, unpacked once from llama-cpp-python's source distribution beside the
    venv (the wheel does not carry them)."""
    import llama_cpp

    target = Path(sys.prefix) / "llama.cpp-source"
    if not (target / "convert_hf_to_gguf.py").is_file():
        download = Path(tempfile.mkdtemp(prefix="sdist-"))
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d",
                        str(download), f"llama-cpp-python=={llama_cpp.__version__}"], check=True)
        import tarfile

        with tarfile.open(next(download.glob("*.tar.gz"))) as archive:
            archive.extractall(download, filter="data")
        shutil.copytree(next(download.glob("*/vendor/llama.cpp")), target)
    return target


def kiln_worker(artifact: str, variant: str, threads: int):
    import kiln
    from kiln.decoder.generate import collect, stream
    from kiln.decoder.sampling import Sampling
    from kiln.decoder.stopping import Stops

    predictor = kiln.load(artifact, variant=variant, threads=threads)
    steps, pad = predictor.engine.steps, predictor.encoder.pad_id

    def generate(ids, new):
        events = stream(steps, pad, ids, Sampling(), Stops(new, frozenset()), predictor.encoder.decode,
                        batch_size=len(ids))
        return [list(g.token_ids) for g in collect(events, [len(i) for i in ids])]

    return generate


def worker(args: list[str]) -> None:
    kind, *rest = args
    threads = int(os.environ.get("KILN_PEER_THREADS", "2"))
    makers = {"transformers": lambda: transformers_worker(rest[0], rest[1], threads),
              "optimum": lambda: optimum_worker(rest[0], threads), "ct2": lambda: ct2_worker(rest[0], threads),
              "genai": lambda: genai_worker(rest[0], rest[1], threads),
              "ov-genai": lambda: ov_genai_worker(rest[0], rest[1], threads),
              "genai-builder": lambda: genai_builder_worker(rest[0], rest[1], threads),
              "llama-cpp": lambda: llama_cpp_worker(rest[0], rest[1], threads),
              "kiln": lambda: kiln_worker(rest[0], rest[1], threads)}
    print(json.dumps(measure(makers[kind]())))


# -- served streams --------------------------------------------------------------------------------------------
def served_streams(artifact: Path, model_dir: str, streams: int) -> dict:
    """``kiln serve`` on the artifact's best variant, ``streams`` clients at once, each streaming one greedy
    64-token /v1/completions of its own 128-token prompt: the tokens/s all clients get together, and each
    client's time to first token. (None of the four peers ships an HTTP server in its package.)"""
    import concurrent.futures

    import httpx
    import transformers

    from kiln.serving import process

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    import numpy as np

    texts = [tokenizer.decode(row) for row in np.random.default_rng(128).integers(100, 1000, (streams, 128))]
    proc, port = process.start_server([sys.executable, "-m", "kiln", "serve", str(artifact)])

    def one(prompt: str) -> tuple[float, int]:
        begin, first, chunks = time.perf_counter(), None, 0
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=600, json={
                "model": "any", "prompt": prompt, "max_tokens": NEW, "temperature": 0, "stream": True}) as reply:
            reply.raise_for_status()
            for line in reply.iter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    first = first or time.perf_counter() - begin
        return first or 0.0, chunks

    try:
        one(texts[0])  # warm-up
        begin = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            done = list(pool.map(one, texts))
        wall = time.perf_counter() - begin
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    firsts = sorted(f for f, _ in done)
    tokens = sum(c for _, c in done)
    return {"streams": streams, "tokens": tokens, "seconds": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
            "first_token_p50_s": round(statistics.median(firsts), 3), "first_token_max_s": round(firsts[-1], 3)}


# -- the orchestrator -----------------------------------------------------------------------------------------
def ensure_venv(venv: Path, packages: list[str] = PEER_PACKAGES) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", packages[0]], check=True)  # torch from disk
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages[1:]], check=True)
    return python


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("artifact", type=Path, help="a kiln optimize output of the same model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--venv", type=Path, default=HERE / ".decoder-peers-venv")
    parser.add_argument("--only", default=None, help="comma-separated configuration names")
    parser.add_argument("--rounds", type=int, default=1,
                        help="passes over the configurations, alternated (a fresh process each); cells are medians")
    parser.add_argument("--json", type=Path, default=OUT / "decoder_peers.json")
    parser.add_argument("--shape", choices=sorted(BUILD_SHAPES),
                        help="build MODEL (random weights of this real model's shape) and kiln optimize's OUT first")
    parser.add_argument("--prompts", choices=("ids", "text"), default="ids",
                        help="random token ids, or held-out manual text in the model's tokenizer (a trained model)")
    parser.add_argument("--lengths", default="128,512", help="prompt lengths in tokens, each at batch 1 and 4")
    args = parser.parse_args()
    from kiln.system.cpu import cpu_info

    if args.shape:
        build(args.shape, args.model, args.artifact)
    peer = str(ensure_venv(args.venv))
    me = sys.executable
    model, art = str(args.model), str(args.artifact)
    manifest = json.loads((args.artifact / "manifest.json").read_text())
    variants = manifest["variants"]  # name -> record
    model_type = json.loads((args.model / "config.json").read_text())["model_type"]
    configs = {"transformers-fp32": [me, "transformers", model, "float32"]}
    if cpu_info().has_bf16:
        configs["transformers-bf16"] = [me, "transformers", model, "bfloat16"]
    if model_type in LLAMA_FAMILY:
        genai = str(ensure_venv(args.venv.parent / ".genai-venv", GENAI_PACKAGES))
        configs.update({"openvino-genai int4 (optimum-cli)": [peer, "ov-genai", model, "int4"],
                        "openvino-genai int8 (optimum-cli)": [peer, "ov-genai", model, "int8"],
                        "onnxruntime-genai int4 (its builder)": [genai, "genai-builder", model, "int4"],
                        "onnxruntime-genai fp32 (its builder)": [genai, "genai-builder", model, "fp32"],
                        "llama.cpp Q4_K_M": [peer, "llama-cpp", model, "Q4_K_M"],
                        "llama.cpp Q8_0": [peer, "llama-cpp", model, "Q8_0"]})
    else:
        configs.update({"optimum-intel-int8-weights": [peer, "optimum", model],
                        "ctranslate2-int8": [peer, "ct2", model]})
    # GenAI runs the exported step graph (mask in, cache concatenated), kept as the artifact's reference where a
    # decoder's defaults replaced onnx-fp32 by onnx-fused; the fused graph takes no attention mask, which GenAI wants.
    graphs = dict(variants)
    reference = manifest["build"].get("reference_variant")
    if reference and reference["name"] not in graphs:
        graphs[reference["name"]] = reference
    for name in ("onnx-fp32", "onnx-int8-dynamic") if model_type not in LLAMA_FAMILY else ():
        if name in graphs:
            graph_dir = (args.artifact / graphs[name]["path"]).parent
            configs[f"onnxruntime-genai on kiln {name}"] = [peer, "genai", str(graph_dir), model]
    for name in variants:
        configs[f"kiln {name}"] = [me, "kiln", art, name]
    wanted = set(args.only.split(",")) if args.only else set(configs)
    # --only reruns some configurations and keeps the others' results from the same file.
    results = json.loads(args.json.read_text())["results"] if args.only and args.json.is_file() else {}
    results = {name: result for name, result in results.items() if name not in wanted}  # those are run again
    passes: dict[str, list[dict]] = {}
    prompt_file = Path(tempfile.mkdtemp(prefix="prompts-")) / "prompts.json"
    prompt_file.write_text(json.dumps(prompts(args.prompts, [int(n) for n in args.lengths.split(",")], model)))
    for round_ in range(args.rounds):  # configurations alternate, so a slow spell of the machine hits them all
        for name, (python, *argv) in configs.items():
            if name not in wanted or "error" in results.get(name, {}):
                continue
            print(f"== {name} (round {round_ + 1} of {args.rounds})", flush=True)
            env = {**os.environ, "KILN_PEER_THREADS": str(args.threads), "KILN_PEER_PROMPT_FILE": str(prompt_file)}
            done = subprocess.run([python, __file__, "--worker", *argv], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                results[name] = {"error": _error_of(done.stderr)}
                print(f"   failed: {results[name]['error']}", flush=True)
                continue
            passes.setdefault(name, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name, runs in passes.items():
        if "error" not in results.get(name, {}):
            results[name] = _median_of(runs)
    if "served" in wanted or not args.only:
        print("== kiln serve, 8 and 32 streams", flush=True)
        results["kiln serve (best variant)"] = {"served": [served_streams(args.artifact, model, n) for n in (8, 32)]}
    reference = results.get("transformers-fp32", {}).get("tokens", {})
    eos = _eos_ids(args.model)
    for result in results.values():
        if "tokens" in result and reference:
            seen = [(_until_eos(a, eos), b) for shape in reference
                    for a, b in zip(reference[shape], result["tokens"].get(shape, []))]
            same = [a == b[:len(a)] for a, b in seen]
            result["identical_to_transformers_fp32"] = f"{sum(same)}/{len(same)} sequences"
            result["token_agreement"] = _agreement(reference, result["tokens"], eos)
    before = json.loads(args.json.read_text()) if args.only and args.json.is_file() else {}
    previous = before.get("commands") or ([before["command"]] if "command" in before else [])
    out = {"commands": [*previous, "python " + " ".join(sys.argv)], "cpu": cpu_info().to_dict(), "new_tokens": NEW,
           "threads": args.threads, "prompts": args.prompts, "results": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    for name, result in results.items():
        rows = " | ".join(f"b{r['batch']}/{r['prompt']}: {r['first_token_ms']} + {r['per_token_ms']} ms"
                          for r in result.get("rows", []))
        print(f"{name:42s} {rows or result.get('error') or result.get('served')} "
              f"{result.get('identical_to_transformers_fp32', '')}")
    print(f"-> {args.json}")


def build(shape: str, model: Path, artifact: Path) -> None:
    """A random-weight model of ``shape`` at ``model`` (its tokenizer told the model's context) and kiln
    optimize's variants for the peers' precisions at ``artifact``; either is kept when already there."""
    if not (model / "config.json").is_file():
        from kiln.tasks import TaskName
        from kiln.testing.factory import build_tiny_model

        arch, values = BUILD_SHAPES[shape]
        build_tiny_model(arch, TaskName.TEXT_GENERATION, model, shape=values)
        config = json.loads((model / "tokenizer_config.json").read_text())
        config["model_max_length"] = values["max_position_embeddings"]
        (model / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    if not (artifact / "manifest.json").is_file():
        # Random weights: the gate's figures say nothing of quantization here (the trained model is where they are
        # judged; random int4 kept 0.40 of next tokens), and its search would keep layers no trained model needs;
        # a tolerance this loose keeps every variant for the timings.
        subprocess.run([sys.executable, "-m", "kiln", "optimize", str(model), "--task", "text-generation", "-o",
                        str(artifact), "--variants", LLAMA_VARIANTS, "--tolerance", "0.95"], check=True)


def _error_of(stderr: str) -> str:
    """A failed worker's reason: the last exception line of its stderr (a subprocess's own error, raised inside
    the worker, comes before the CalledProcessError that reports it)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)]
    return (errors[0] if errors else lines[-1] if lines else "failed")[:400]


def _median_of(runs: list[dict]) -> dict:
    """One configuration's passes as one result: each cell the median over the passes, the passes kept beside it
    (``rounds``), and the first pass's tokens (greedy decoding gives the same tokens on every pass)."""
    if len(runs) == 1:
        return runs[0]
    rows = [{**cells[0], **{key: round(statistics.median(c[key] for c in cells), 2)
                            for key in ("first_token_ms", "per_token_ms")}}
            for cells in zip(*(run["rows"] for run in runs))]
    return {"rows": rows, "tokens": runs[0]["tokens"], "rounds": [run["rows"] for run in runs]}


def _eos_ids(model: Path) -> set[int]:
    eos = json.loads((model / "config.json").read_text()).get("eos_token_id")
    return set(eos if isinstance(eos, list) else [eos] if eos is not None else [])


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The tokens a user sees: up to the first EOS (every configuration generates past it, as told, but how each
    one is told differs: GenAI's min_length forbids EOS, the others ignore it)."""
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos), tokens)


def _agreement(reference: dict, tokens: dict, eos: set[int]) -> float:
    """Share of the reference's tokens (up to its first EOS) matched by the configuration's, up to the first
    difference in each sequence counted as the rest of it (a greedy decoding that diverges once continues from
    another text)."""
    kept = total = 0
    for shape, rows in reference.items():
        for a, b in zip(rows, tokens.get(shape, [])):
            a = _until_eos(a, eos)
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            kept, total = kept + first, total + len(a)
    return round(kept / total, 4) if total else 0.0


if __name__ == "__main__":
    main()
