"""Does the gate's verdict hold on text it never saw? An embedder artifact's variants against sentence-transformers
on PyTorch fp32, on unseen texts of five kinds, against what the gate measured on its agreement texts.

Kinds (none of them calibrated on, all shipped with Python or Debian):

- ``documentation``: the held-out half of Python's documentation, 10 tokens to the model's maximum (the gate's kind);
- ``docstrings``: the standard library's docstrings (other technical prose);
- ``queries``: 3-16 tokens cut from the held-out documentation (what a search box sends);
- ``code``: the standard library's Python source;
- ``licences``: Debian's ``/usr/share/common-licenses`` (legal prose).

Per variant and kind, the truth: the least cosine, the 0.1st percentile and the share below the floor over ``--texts``
texts. Then the gate's prediction, over ``--draws`` random samples of 160 texts of the kind (the gate's number): the
share of samples the gate would accept on its least cosine alone (kiln before the bound) and on its least cosine and
``cosine_bound`` (``length_bound``: a log-normal tolerance bound per length bucket, 99.9% of texts, 95% confidence).
A gate that predicts well accepts a kind's samples only where the kind's share below the floor is about 0.1% or less.

    python benchmarks/unseen_text.py ARTIFACT [--variants onnx-int8-dynamic-rows,openvino-bf16] [--model DIR]
        [--texts 1024] [--draws 400] [--json out.json]

The reference is ``SentenceTransformer(--model)`` (default: the bundled all-MiniLM-L6-v2), encoding on the CPU in
fp32; each variant runs through ``kiln.load(ARTIFACT, variant).encode`` with its own batching.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
QUERY_TOKENS = (3, 16)
DRAW_SIZE = 160  # the gate's agreement texts for an embedder


def kinds(count: int, maximum: int, token_count) -> dict[str, list[str]]:
    from kiln.data import corpus
    from kiln.data.docstrings import docstring_sentences
    from kiln.data.texts import length_mix

    code = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]:
        code += path.read_text(errors="ignore").split()
    licences = []
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file():
            licences += path.read_text(errors="ignore").split()
    sources = {"documentation": (corpus.sentences("held-out"), 10, maximum),
               "docstrings": (docstring_sentences(), 10, maximum),
               "queries": (corpus.sentences("held-out"), *QUERY_TOKENS),
               "code": ([" ".join(code)], 10, maximum),
               "licences": ([" ".join(licences)] if licences else [], 10, maximum)}
    return {name: length_mix(count, low, high, seed=101 + k, token_count=token_count, source=source)
            for k, (name, (source, low, high)) in enumerate(sources.items()) if source}


def gate_figures(artifact: Path, variant: str) -> dict[str, float]:
    """What kiln optimize measured for the variant on its agreement texts (the worst batching)."""
    record = json.loads((artifact / "manifest.json").read_text())["variants"].get(variant) or {}
    figures = (record.get("agreement") or {}).get("figures") or {}
    return {k: figures[k] for k in ("min_cosine", "cosine_bound") if k in figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--variants", default="", help="comma-separated; default: every variant the artifact holds")
    parser.add_argument("--model", default=None, help="the original (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--texts", type=int, default=1024, help="unseen texts of each kind")
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--floor", type=float, default=0.99)
    parser.add_argument("--json", type=Path, default=HERE / "out" / "unseen-text.json")
    options = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    import kiln
    from kiln.source.loading import bundled_model_dir
    from kiln.tasks.validation import length_bound

    reference = SentenceTransformer(options.model or str(bundled_model_dir()), device="cpu")
    tokenizer = reference.tokenizer
    texts = kinds(options.texts, reference.max_seq_length, lambda t: len(tokenizer(t)["input_ids"]))
    every = [t for group in texts.values() for t in group]
    lengths = np.array([len(ids) for ids in tokenizer(every, truncation=True)["input_ids"]])
    want = reference.encode(every, batch_size=32, normalize_embeddings=True)
    manifest = json.loads((options.artifact / "manifest.json").read_text())
    variants = [v for v in options.variants.split(",") if v] or [name for name in manifest["variants"]
                                                               if (options.artifact / name).is_dir()]
    rng = np.random.default_rng(0)
    rows = []
    for variant in variants:
        got = np.asarray(kiln.load(str(options.artifact), variant, threads=2).encode(every), dtype=np.float64)
        cosines = (got / np.linalg.norm(got, axis=1, keepdims=True) * want).sum(1)
        start = 0
        for kind, group in texts.items():
            c, n = cosines[start:start + len(group)], lengths[start:start + len(group)]
            start += len(group)
            draws = [rng.choice(len(c), DRAW_SIZE, replace=False) for _ in range(options.draws)]
            by_min = [c[d].min() >= options.floor for d in draws]
            bounds = [length_bound(c[d], n[d].tolist()) for d in draws]
            by_bound = [m and (b is None or b >= options.floor) for m, b in zip(by_min, bounds)]
            rows.append({"variant": variant, "kind": kind, "texts": len(c), **{
                f"gate_{k}": v for k, v in gate_figures(options.artifact, variant).items()},
                "min_cosine": float(c.min()), "p0.1_cosine": float(np.percentile(c, 0.1)),
                "mean_cosine": float(c.mean()), "share_below_floor": float((c < options.floor).mean()),
                "accepted_by_min": float(np.mean(by_min)), "accepted_by_min_and_bound": float(np.mean(by_bound))})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    data = {"artifact": str(options.artifact), "floor": options.floor, "draws": options.draws,
            "draw_size": DRAW_SIZE, "rows": rows}
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(data, indent=1))
    print("\n".join(table(data)))


def table(data: dict) -> list[str]:
    """The markdown table RESULTS.md shows."""
    lines = ["| variant | its gate: min / bound | unseen kind | min | 0.1st percentile | share < floor | "
             "samples accepted: min / min + bound |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in data["rows"]:
        gate = " / ".join(f"{r[k]:.4f}" if k in r else "-" for k in ("gate_min_cosine", "gate_cosine_bound"))
        lines.append(f"| {r['variant']} | {gate} | {r['kind']} | {r['min_cosine']:.4f} | {r['p0.1_cosine']:.4f} | "
                     f"{r['share_below_floor']:.2%} | {r['accepted_by_min']:.0%} / "
                     f"{r['accepted_by_min_and_bound']:.0%} |")
    return lines


if __name__ == "__main__":
    main()
