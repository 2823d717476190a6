"""Students of the bundled MiniLM, trained on text nobody here wrote, judged against their teacher (issue 11).

For each ``--layers K``, in one run:
  * ``kiln distill --layers K`` on the sentences of the standard library's docstrings (about 12,700 with
    Python 3.11, ``kiln.data.docstrings``; the reference manual's held-out half is removed from them), timed;
  * fidelity on held-out text, never trained on: 1,000 sentences of the reference manual's held-out half,
    cosine of the student's embedding to the teacher's, mean and min per token-length bucket; and STS Spearman
    on kiln's built-in pairs, the student's against the teacher's;
  * ``kiln optimize STUDENT --reference TEACHER --variants VARIANT --tolerance T``: the gate's verdict on the
    student's int8 variant against the teacher; and ``kiln optimize STUDENT --variants VARIANT`` (judged against
    the student itself), whose variant is timed whatever that verdict, so the speed of each student is known;
  * end-to-end throughput (``kiln.load(...).predict``, tokenization included, serving defaults) of each student's
    variant and of today's best (the teacher's own variant, built here or given with ``--baseline``) on 1,024
    held-out texts of 10-200 tokens, each in a fresh process, rounds alternating, best of each.

With ``--prune "OPTIONS;..."`` the same for ``kiln prune`` models, and with ``--classifier`` a 3-layer student of
the suite's fine-tuned sentiment head (kiln.testing.finetune): its accuracy against the teacher's.

    python benchmarks/distill_minilm.py --layers 3,4 --distill-args "--epochs 5" \
        --prune "--ffn 0.5 --heads 0.25 --recover-epochs 2" --classifier --work /tmp/distill-bench \
        --json benchmarks/distill.minilm.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np


def _kiln(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True)


def _texts(work: Path, packages: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
    """The training texts (docstring sentences of the standard library, and of ``packages``, minus held-out
    ones) and 1,000 held-out sentences."""
    from kiln.data import corpus
    from kiln.data.docstrings import docstring_sentences

    held_out = list(corpus.sentences("held-out"))
    held = set(held_out)
    train = [s for s in docstring_sentences(packages) if s not in held]
    path = work / "train.txt"
    path.write_text("\n".join(train) + "\n")
    return path, held_out[:1000]


def _fidelity(student: Path, held_out: list[str]) -> dict:
    from kiln.records.figures import bucket_index, bucket_label
    from kiln.source.loading import load_source
    from kiln.source.reference import reference_predictor
    from kiln.tasks import task_spec

    spec = task_spec("feature-extraction")
    teacher = reference_predictor(load_source(None, "feature-extraction"))
    pupil = reference_predictor(load_source(str(student), "feature-extraction"))
    a, b = np.stack(teacher.predict(held_out)), np.stack(pupil.predict(held_out))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    lengths = [len(e.ids) for e in teacher.prepare(held_out).encodings]
    index = np.array([bucket_index(n) for n in lengths])
    buckets = [{"tokens": bucket_label(i), "count": int((index == i).sum()), "mean": float(cos[index == i].mean()),
                "min": float(cos[index == i].min())} for i in sorted(set(index.tolist()))]
    sts = spec.validation.builtin_eval()
    return {"texts": len(held_out), "mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
            "buckets": buckets, "sts_spearman": spec.validation.evaluate(pupil, sts)["spearman"],
            "teacher_sts_spearman": spec.validation.evaluate(teacher, sts)["spearman"]}


THROUGHPUT = """
import json, sys, time
import kiln
from kiln.data import corpus
from kiln.data.texts import length_mix
predictor = kiln.load(sys.argv[1])
texts = length_mix(1024, 10, 200, seed=5, token_count=predictor.encoder.token_count,
                   source=corpus.sentences("held-out"))
predictor.predict(texts[:64])
begin = time.perf_counter()
predictor.predict(texts)
print(json.dumps({"texts_per_s": len(texts) / (time.perf_counter() - begin)}))
"""


def _throughput(artifacts: dict[str, Path], rounds: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in artifacts}
    for _ in range(rounds):
        for name, path in artifacts.items():
            done = subprocess.run([sys.executable, "-c", THROUGHPUT, str(path)], capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"timing {name} failed: {done.stderr[-2000:]}")
            rates[name].append(json.loads(done.stdout.strip().splitlines()[-1])["texts_per_s"])
    return rates


def _student(name: str, command: list[str], lineage_file: str, out: Path, args, teacher: Path, held_out: list[str],
             artifacts: dict[str, Path]) -> dict:
    """Make one student (distilled or pruned) of the teacher, measure its fidelity, gate it, build its variant."""
    if not (args.reuse and (out / lineage_file).is_file()):
        done = _kiln(*command, "-o", str(out), "--force")
        if done.returncode:
            raise SystemExit(f"kiln {' '.join(command)} failed: {done.stderr[-2000:]}")
    lineage = json.loads((out / lineage_file).read_text())
    minutes = lineage["seconds"] / 60  # the run's own wall time (loading and evaluation included)
    entry = {"command": "kiln " + " ".join(command), "minutes": minutes, "student": lineage["student"],
             "epochs": lineage["history"], "held_out_agreement": lineage["agreement"],
             "fidelity": _fidelity(out, held_out)}
    opt = args.work / f"opt-{out.name}"
    done = _kiln("optimize", str(out), "--reference", str(teacher), "--variants", args.variant,
                 "--tolerance", str(args.tolerance), "-o", str(opt), "--force")
    entry["gate_against_teacher"] = {"exit": done.returncode, "output": (done.stdout + done.stderr)[-1500:]}
    speed = args.work / f"speed-{out.name}"
    done = _kiln("optimize", str(out), "--variants", args.variant, "-o", str(speed), "--force")
    if done.returncode:
        raise SystemExit(f"kiln optimize {out} failed: {done.stderr[-2000:]}")
    artifacts[name] = speed / "best"
    print(f"{name}: {minutes:.1f} min, held-out cosine mean {entry['fidelity']['mean_cosine']:.4f} min "
          f"{entry['fidelity']['min_cosine']:.4f}, STS {entry['fidelity']['sts_spearman']:.4f} (teacher "
          f"{entry['fidelity']['teacher_sts_spearman']:.4f}), gate against the teacher at --tolerance "
          f"{args.tolerance}: exit {entry['gate_against_teacher']['exit']}", flush=True)
    return entry


def _classifier(args, train: Path) -> dict:
    """A 3-layer student of the suite's fine-tuned MiniLM sentiment head (kiln.testing.finetune): accuracy on the
    generated eval rows against the teacher's, and top-label agreement on real sentences it never saw."""
    from kiln.data import corpus
    from kiln.source.loading import load_source
    from kiln.source.reference import reference_predictor
    from kiln.tasks import task_spec
    from kiln.testing.finetune import sentiment_examples, sentiment_model, write_jsonl
    from kiln.validation.evalsets import load_eval_set

    teacher = sentiment_model()
    rows = write_jsonl(sentiment_examples(2000, seed=11), args.work / "sentiment-train.jsonl")
    evaluation = write_jsonl(sentiment_examples(1000, seed=12), args.work / "sentiment-eval.jsonl")
    texts = args.work / "classifier-texts.txt"
    texts.write_text("".join(train.read_text().splitlines(keepends=True)[:4000]))
    out = args.work / "student-classifier"
    command = ["distill", str(teacher), "--task", "text-classification", "--layers", "3", "--texts", str(texts),
               "--train", str(rows), *args.classifier_args.split()]
    if not (args.reuse and (out / "kiln-distill.json").is_file()):
        done = _kiln(*command, "-o", str(out), "--force")
        if done.returncode:
            raise SystemExit(f"kiln distill of the classifier failed: {done.stderr[-2000:]}")
    spec = task_spec("text-classification")
    data = load_eval_set(evaluation, "text-classification")
    ours = reference_predictor(load_source(str(out), "text-classification"))
    theirs = reference_predictor(load_source(str(teacher), "text-classification"))
    sentences = list(corpus.sentences("held-out"))[:1000]
    # each prediction is the top-1 list of LabelScore(label, score): compare the labels themselves
    labels = [[top[0].label for top in p.predict(sentences)] for p in (ours, theirs)]
    same = float(np.mean([a == b for a, b in zip(*labels, strict=True)]))
    lineage = json.loads((out / "kiln-distill.json").read_text())
    result = {"command": "kiln " + " ".join(command), "minutes": lineage["seconds"] / 60,
              "teacher": spec.validation.evaluate(theirs, data), "student": spec.validation.evaluate(ours, data),
              "held_out_label_agreement": same, "held_out_texts": len(sentences),
              "held_out_teacher_labels": {label: labels[1].count(label) for label in sorted(set(labels[1]))}}
    result["accuracy_kept"] = result["student"]["accuracy"] / result["teacher"]["accuracy"]
    print(f"classifier, 3 layers: accuracy {result['student']['accuracy']:.4f} vs the teacher's "
          f"{result['teacher']['accuracy']:.4f} ({result['accuracy_kept']:.1%} kept); same top label on "
          f"{same:.1%} of {len(sentences)} held-out sentences; {result['minutes']:.1f} min", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="3,4", help="distilled students: layer counts ('' for none)")
    parser.add_argument("--prune", default="", help="pruned models, ';'-separated `kiln prune` option sets, "
                        "e.g. '--ffn 0.5 --heads 0.25;--ffn 0.25'")
    parser.add_argument("--classifier", action="store_true", help="also a 3-layer student of the fine-tuned "
                        "sentiment head (accuracy kept)")
    parser.add_argument("--classifier-args", default="--epochs 2")
    parser.add_argument("--work", type=Path, default=Path("distill-bench"))
    parser.add_argument("--packages", default="", help="also train on the docstrings of these installed "
                        "packages (import names, e.g. numpy,scipy,sklearn,sympy,networkx)")
    parser.add_argument("--distill-args", default="", help="extra `kiln distill` options, e.g. '--epochs 4'")
    parser.add_argument("--variant", default="onnx-int8-dynamic")
    parser.add_argument("--tolerance", type=float, default=0.1, help="the students' gate against the teacher")
    parser.add_argument("--baseline", type=Path, default=None, help="today's best: a kiln optimize output")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reuse", action="store_true", help="keep students already in --work (their lineage "
                        "says how long they took)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from kiln.source.loading import bundled_model_dir

    args.work.mkdir(parents=True, exist_ok=True)
    train, held_out = _texts(args.work, tuple(p for p in args.packages.split(",") if p))
    teacher = bundled_model_dir()
    result: dict = {"train_texts": sum(1 for _ in train.open()), "held_out_texts": len(held_out),
                    "variant": args.variant, "tolerance": args.tolerance, "students": {}}
    artifacts: dict[str, Path] = {}
    baseline = args.baseline
    if baseline is None:
        baseline = args.work / "opt-teacher"
    if not (baseline / "best").is_dir():
        done = _kiln("optimize", "--variants", args.variant, "-o", str(baseline), "--force")
        if done.returncode:
            raise SystemExit(f"kiln optimize of the teacher failed: {done.stderr[-2000:]}")
    artifacts["teacher"] = baseline / "best"
    for k in (int(x) for x in args.layers.split(",") if x.strip()):
        command = ["distill", "--layers", str(k), "--texts", str(train), *args.distill_args.split()]
        result["students"][f"{k} layers"] = _student(f"{k} layers", command, "kiln-distill.json",
                                                     args.work / f"student-{k}", args, teacher, held_out, artifacts)
    for i, options in enumerate(o for o in args.prune.split(";") if o.strip()):
        name = f"pruned {options.strip()}"
        command = ["prune", "--texts", str(train), *options.split()]
        result["students"][name] = _student(name, command, "kiln-prune.json", args.work / f"pruned-{i}", args,
                                            teacher, held_out, artifacts)
    if args.classifier:
        result["classifier"] = _classifier(args, train)
    rates = _throughput(artifacts, args.rounds)
    base = max(rates["teacher"])
    result["throughput"] = {name: {"rounds": r, "best": max(r), "vs_teacher": max(r) / base}
                            for name, r in rates.items()}
    for name, r in result["throughput"].items():
        print(f"{name}: {r['best']:.1f} texts/s ({r['vs_teacher']:.2f}x today's best)", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
