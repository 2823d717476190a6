"""Speculative decoding against kiln's own greedy decoding, on a GPT-2 trained here (nothing downloads).

1. A GPT-2 is trained on Python's documentation and docstrings (benchmarks/decoder_fidelity.py's recipe and
   tokenizer; ``--layers``/``--width`` set its shape, ``--minutes`` its training time).
2. ``kiln distill --layers 1`` makes its one-layer student on the same training text (the teacher labels it).
3. Both are exported to ONNX (kiln's KV-cache step graph) and loaded with ``kiln.load``.
4. Prompts from the held-out half of the Python reference manual (neither model trained on it) are continued
   greedily, 64 tokens each, batch 1: with the target alone, then with the student as the draft for each
   ``--draft-tokens`` k. Every speculative output must equal the plain greedy output token for token.

    python benchmarks/speculative.py [--minutes 12] [--layers 12] [--width 512] [--prompts 16]

-> benchmarks/speculative.json (tokens/s per setting, the ratio, draft acceptance, the CPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def held_out_prompts(count: int, tokenizer) -> list[str]:
    """``count`` held-out passages cut to 24-48 tokens: prompts neither model saw."""
    from kiln.data import corpus

    out = []
    for sentence in corpus.sentences("held-out"):
        ids = tokenizer(sentence)["input_ids"]
        if len(ids) >= 24:
            out.append(tokenizer.decode(ids[: min(len(ids), 48)]))
        if len(out) == count:
            break
    return out


def timed(predictor, prompts: list[str], new_tokens: int, **options) -> tuple[float, list]:
    """(seconds, results) of one prompt at a time (batch 1), after one warm-up call."""
    predictor.generate(prompts[0], max_new_tokens=4, **options)
    start = time.perf_counter()
    results = [predictor.generate(p, max_new_tokens=new_tokens, **options) for p in prompts]
    return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=12)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--draft-layers", type=int, default=1)
    parser.add_argument("--draft-tokens", default="2,4,6")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--distill-texts", type=int, default=3000, help="training texts the student learns from")
    parser.add_argument("--work", type=Path, default=None, help="keep the models here (default: a temporary dir)")
    parser.add_argument("--output", type=Path, default=HERE / "speculative.json")
    args = parser.parse_args()

    import transformers
    from decoder_fidelity import train, training_text

    import kiln
    from kiln.choices import ExportFormat
    from kiln.compress.distill import distill
    from kiln.decoder.speculative import Speculation, speculative_greedy
    from kiln.export.job import ExportConfig, run_export
    from kiln.system.cpu import cpu_info

    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        target_dir, student_dir = work / "target", work / "student"
        trained = None
        if not (target_dir / "model.safetensors").is_file():
            trained = train(target_dir, args.minutes, args.layers, args.width)
        texts = work / "texts.txt"
        lines = [t.replace("\n", " ") for t in training_text() if t.strip()]
        texts.write_text("\n".join(lines[:: max(1, len(lines) // args.distill_texts)][: args.distill_texts]))
        distilled = None
        if not (student_dir / "model.safetensors").is_file():
            begin = time.perf_counter()
            result = distill(target_dir, task="text-generation", output=student_dir, layers=args.draft_layers,
                             texts=texts, recipe={"epochs": 1, "max_length": 128}, overwrite=True)
            distilled = {"seconds": round(time.perf_counter() - begin, 1), "agreement": result.agreement,
                         "figures": result.figures, "parameters": result.parameters,
                         "teacher_parameters": result.teacher_parameters}
        arts = {}
        for name, directory in (("target", target_dir), ("student", student_dir)):
            arts[name] = work / f"{name}-onnx"
            if not arts[name].is_dir():
                run_export(ExportConfig(model=str(directory), task="text-generation", format=ExportFormat.ONNX,
                                        output=arts[name]))
        target, student = kiln.load(arts["target"]), kiln.load(arts["student"])
        tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir)
        prompts = held_out_prompts(args.prompts, tokenizer)

        rows, plain_times = [], []
        for _ in range(args.rounds):
            seconds, greedy = timed(target, prompts, args.new_tokens)
            plain_times.append(seconds)
        tokens = sum(len(g.token_ids) for g in greedy)
        plain = min(plain_times)
        for k in (int(x) for x in args.draft_tokens.split(",")):
            times = []
            for _ in range(args.rounds):
                seconds, got = timed(target, prompts, args.new_tokens, draft=student, draft_tokens=k)
                times.append(seconds)
                if got != greedy:
                    raise SystemExit(f"draft_tokens {k}: speculative output differs from greedy decoding")
            record = Speculation()
            for p in prompts:
                ids = target.encoder.encode([p], truncate=False)[0].ids
                speculative_greedy(target.engine.steps, student.engine.steps, ids, args.new_tokens,
                                   frozenset(target.config.eos_ids), k, record)
            best = min(times)
            rows.append({"draft_tokens": k, "seconds": round(best, 3), "tokens_per_s": round(tokens / best, 1),
                         "speedup": round(plain / best, 2), "acceptance": round(record.acceptance, 3),
                         "tokens_per_target_step": round(statistics.mean(record.per_round), 2),
                         "identical_to_greedy": True})
            print(rows[-1], flush=True)
    out = {"command": "python " + " ".join(sys.argv), "cpu": cpu_info().to_dict(),
           "machine": platform.processor() or platform.machine(), "prompts": len(prompts),
           "new_tokens": args.new_tokens, "generated_tokens": tokens, "target": trained or "reused from --work",
           "student": distilled or "reused from --work",
           "greedy": {"seconds": round(plain, 3), "tokens_per_s": round(tokens / plain, 1)}, "speculative": rows}
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
