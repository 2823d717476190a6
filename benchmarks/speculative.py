"""Speculative decoding against kiln's own greedy decoding, on a GPT-2 trained here (nothing downloads).

1. A GPT-2 is trained on Python's documentation and docstrings (benchmarks/decoder_fidelity.py's recipe and
   tokenizer; ``--layers``/``--width`` set its shape, ``--minutes`` its training time).
2. ``kiln distill --layers 1 --continuations 1500`` makes its one-layer student on the same training text (the
   teacher labels it) and on the target's own greedy continuations of 1500 of those texts' openings: the draft
   learns what the target writes (``--continuations 0``: natural text only, as before). They go on through EOS,
   as the timed decoding below does.
3. Both are exported to ONNX (kiln's KV-cache step graph) and loaded with ``kiln.load``.
4. Prompts from the held-out half of the Python reference manual (neither model trained on it) are continued
   greedily, 64 tokens each, batch 1: with the target alone, then with the student as the draft for each
   ``--draft-tokens`` k. Every speculative output must equal the plain greedy output token for token.

    python benchmarks/speculative.py [--minutes 12] [--layers 12] [--width 512] [--prompts 16] [--variant onnx-fused]

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

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree

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


def greedy_tokens(predictor, prompts: list[list[int]], new_tokens: int) -> list[tuple[int, ...]]:
    """kiln's own greedy decoding (the continuous-batching stream generate() runs), one prompt at a time, never
    stopping at EOS: a briefly trained model ends most texts within a few tokens."""
    from kiln.decoder.generate import collect, stream
    from kiln.decoder.sampling import Sampling
    from kiln.decoder.stopping import Stops

    out = []
    for prompt in prompts:
        events = stream(predictor.engine.steps, predictor.encoder.pad_id, [prompt], Sampling(),
                        Stops(new_tokens, frozenset()), predictor.encoder.decode, batch_size=1)
        out.append(collect(events, [len(prompt)])[0].token_ids)
    return out


def speculative_tokens(target, draft_steps, prompts: list[list[int]], new_tokens: int, k: int, record=None):
    from kiln.decoder.speculative import speculative_greedy

    return [tuple(speculative_greedy(target.engine.steps, draft_steps, p, new_tokens, frozenset(), k, record))
            for p in prompts]


def clock(call) -> tuple[float, object]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=12)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--draft-layers", type=int, default=1)
    parser.add_argument("--draft-tokens", default="1,2,3,4")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--spin-wait", action="store_true", help="let ONNX Runtime's threads spin between runs")
    parser.add_argument("--distill-texts", type=int, default=3000, help="training texts the student learns from")
    parser.add_argument("--continuations", type=int, default=1500,
                        help="kiln distill --continuations: the target's own continuations of this many training "
                        "texts join them (0: natural text only)")
    parser.add_argument("--distill-epochs", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="keep the models here (default: a temporary dir)")
    parser.add_argument("--variant", default="onnx-fp32", choices=("onnx-fp32", "onnx-fused"),
                        help="the step graph both models run: the export, or kiln's fused graph (cache in place)")
    parser.add_argument("--json", "--output", dest="output", type=Path, default=OUT / "speculative.json")
    args = parser.parse_args()

    import transformers
    from decoder_fidelity import train, training_text

    import kiln
    from kiln.api.build import distill
    from kiln.choices import ExportFormat
    from kiln.decoder.speculative import Speculation
    from kiln.exporting.job import ExportConfig, run_export
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob
    from kiln.system.cpu import cpu_info

    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        target_dir = work / "target"
        # One student per recipe, so reruns on the same --work compare them on the same target.
        student_dir = work / f"student-e{args.distill_epochs}-c{args.continuations}"
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
                             texts=texts, epochs=args.distill_epochs, max_length=128,
                             continuations=args.continuations, continuations_past_eos=True, overwrite=True)
            distilled = {"seconds": round(time.perf_counter() - begin, 1), "agreement": result.agreement,
                         "continuations": args.continuations, "epochs": args.distill_epochs,
                         "figures": result.figures, "parameters": result.parameters,
                         "teacher_parameters": result.teacher_parameters}
        made = work / "made.json"  # how the models were made, kept for reruns on the same --work
        if trained or distilled:
            known = json.loads(made.read_text()) if made.is_file() else {}
            made.write_text(json.dumps({**known, **({"target": trained} if trained else {}),
                                        **({student_dir.name: distilled} if distilled else {})}))
        known = json.loads(made.read_text()) if made.is_file() else {}
        trained, distilled = trained or known.get("target"), distilled or known.get(student_dir.name)
        arts = {}
        for name, directory in (("target", target_dir), (student_dir.name, student_dir)):
            arts[name] = work / f"{name}-{args.variant}"
            if arts[name].is_dir():
                continue
            if args.variant == "onnx-fp32":
                run_export(ExportConfig(model=str(directory), task="text-generation", format=ExportFormat.ONNX,
                                        output=arts[name]))
            else:  # built and judged as kiln optimize builds it
                OptimizeJob(OptimizeConfig(model=str(directory), task="text-generation", output=arts[name],
                                           variants=(args.variant,))).run()
        # Both sessions' threads sleep between runs: they take turns on the same cores (kiln.load's spin_wait).
        target, student = (kiln.load(arts[n], spin_wait=args.spin_wait) for n in ("target", student_dir.name))
        tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir)
        prompts = held_out_prompts(args.prompts, tokenizer)

        ids = [target.encoder.encode([p], truncate=False)[0].ids for p in prompts]
        ks = [int(x) for x in args.draft_tokens.split(",")]
        draft_steps = student.engine.new_stepper()
        greedy_tokens(target, ids[:1], 4)  # warm-up, both models
        speculative_tokens(target, draft_steps, ids[:1], 4, ks[0])
        plain_times, times, greedy = [], {k: [] for k in ks}, None
        for _ in range(args.rounds):  # interleaved, so a slower moment of the machine costs each setting alike
            seconds, greedy = clock(lambda: greedy_tokens(target, ids, args.new_tokens))
            plain_times.append(seconds)
            for k in ks:
                seconds, got = clock(lambda k=k: speculative_tokens(target, draft_steps, ids, args.new_tokens, k))
                times[k].append(seconds)
                if got != greedy:
                    raise SystemExit(f"draft_tokens {k}: speculative output differs from greedy decoding")
        tokens = sum(len(g) for g in greedy)
        plain = min(plain_times)
        rows = []
        for k in ks:
            record = Speculation()
            speculative_tokens(target, draft_steps, ids, args.new_tokens, k, record)
            best = min(times[k])
            rows.append({"draft_tokens": k, "seconds": round(best, 3), "tokens_per_s": round(tokens / best, 1),
                         "speedup": round(plain / best, 2), "acceptance": round(record.acceptance, 3),
                         "tokens_per_target_step": round(statistics.mean(record.per_round), 2),
                         "identical_to_greedy": True})
            print(rows[-1], flush=True)
    out = {"command": "python " + " ".join(sys.argv), "cpu": cpu_info().to_dict(),
           "machine": platform.processor() or platform.machine(), "prompts": len(prompts),
           "new_tokens": args.new_tokens, "spin_wait": args.spin_wait, "variant": args.variant,
           "generated_tokens": tokens,
           "target": trained or "reused from --work",
           "student": distilled or "reused from --work",
           "greedy": {"seconds": round(plain, 3), "tokens_per_s": round(tokens / plain, 1)}, "speculative": rows,
           "sample": target.encoder.decode(list(greedy[0]))}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
