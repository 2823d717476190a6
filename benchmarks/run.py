"""The benchmark suite: run every part, or the named ones, and rewrite their sections of benchmarks/RESULTS.md.

    python benchmarks/run.py --list                       # the parts, what each needs and roughly how long it takes
    python benchmarks/run.py peers serve-load --artifact kiln-out --results
    python benchmarks/run.py --render-only peers --results  # re-render a part from its last JSON

Each part runs one canonical script (or kiln's own command) with ``--json benchmarks/out/PART.json`` and gets a stamp
beside it (``PART.meta.json``: commit, CPU class, date, the command). With ``--results`` the part's section of
RESULTS.md for that CPU class (between ``<!-- part: NAME CLASS -->`` and ``<!-- /part -->``) is replaced by a table
rendered from that JSON, so RESULTS.md holds the current figure of every part on every CPU class it ran on, with the
command that made it. A part that fails keeps its old
section and makes the exit status non-zero.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
RESULTS = HERE / "RESULTS.md"

Render = Callable[[Any], list[str]]


@dataclass(frozen=True)
class Part:
    """One question the suite answers: the command that measures it, what it needs, how its figures read."""

    name: str
    title: str
    command: Callable[[argparse.Namespace, Path], list[str]]  # (options, JSON path) -> argv after the interpreter
    needs: str  # what must exist first, for --list and the refusal message
    minutes: int  # rough wall time on 2 cores
    render: Render
    # Where a kiln command writes its results.json ({artifact}, {work}: the part's own output directory), copied to
    # the part's JSON after the run; None for a script, which writes its --json itself.
    results: str | None = None


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 2 else f"{value:.1f}"
    return "" if value is None else str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]


def render_generic(data: Any) -> list[str]:
    """Every number and string of the JSON, one row each (nested keys joined by dots; lists by index), at most 40."""
    rows: list[list[Any]] = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list) and len(value) <= 8:
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            rows.append([key, value])

    walk(data, "")
    shown = _table(["figure", "value"], rows[:40])
    return shown + ([f"\n({len(rows) - 40} more figures in the JSON)"] if len(rows) > 40 else [])


def render_peers(data: dict[str, Any]) -> list[str]:
    """The medians over rounds per configuration, and peers.py's own ratios (medians of per-round ratios)."""
    medians = {name: f for name, f in data["median"].items() if name not in ("ratios", "kiln-variants")}
    columns = ("end_to_end_per_s", "engine_per_s", "b1_128_ms", "cosine_mean", "cosine_min", "sentences_cosine_mean",
               "sentences_cosine_min")
    rows = [[name, *(figures.get(c) for c in columns)] for name, figures in medians.items()]
    lines = _table(["configuration", "end to end texts/s", "engine-only seq/s", "batch-1 ms @128", "cosine mean",
                    "cosine min", "plain mean", "plain min"], rows)
    ratios = data["median"].get("ratios")
    if ratios:
        lines.append(f"\nkiln end to end **{ratios['end_to_end_vs_best_peer']:.2f}x** the best peer at kiln's bar "
                     f"(min cosine >= 0.99 on the held-out texts: {ratios['best_peer']}), "
                     f"{ratios['end_to_end_vs_best_peer_on_both']:.2f}x the best that also holds 0.99 on the plain "
                     f"sentences ({ratios['best_peer_on_both_text_sets']}); {data['texts']} texts, {data['threads']} "
                     "threads, medians of per-round ratios.")
        fastest = max((n for n in medians if n != "kiln"), key=lambda n: medians[n].get("end_to_end_per_s") or 0)
        if fastest != ratios["best_peer"]:  # a faster peer below the bar: said, with what it costs
            f, ours = medians[fastest], medians["kiln"]["end_to_end_per_s"]
            lines.append(f"The fastest peer of all, {fastest} ({f['end_to_end_per_s']:.1f} texts/s), holds min cosine "
                         f"{f['cosine_min']:.4f}: kiln is {ours / f['end_to_end_per_s']:.2f}x it (medians) at its own "
                         "floor.")
    variants = data["median"].get("kiln-variants")
    if variants:  # peers.py --variants: is kiln optimize's choice the fastest end to end?
        each = [f"{n}{' (best/)' if n == variants['best'] else ''} {v:.1f} "
                f"({_cell(variants['optimize_ms_per_seq'].get(n))})"
                for n, v in sorted(variants["end_to_end_per_s"].items(), key=lambda kv: -kv[1])]
        lines.append("\nEvery accepted variant end to end (`kiln.load(OUT, variant=NAME).predict`), texts/s "
                     f"(kiln optimize's ms/seq): {', '.join(each)}; kiln optimize's best/ is "
                     f"{variants['best_vs_fastest']:.2f}x the fastest ({variants['fastest']}).")
    return lines


def render_serve_load(data: dict[str, Any]) -> list[str]:
    """kiln serve against offline, alternated (--paired); other runs render every figure."""
    paired = data.get("paired")
    if not paired:
        return render_generic(data)
    rounds = [r["ratio"] for r in paired["rounds"]]
    return _table(["variant", "clients", "served / offline (median)", "rounds", "offline texts/s", "served req/s",
                   "p99 ms (median / worst)"],
                  [[paired["plan"].get("variant"), paired["clients"], paired["median_ratio"],
                    ", ".join(f"{r:.3f}" for r in rounds), paired["median_offline_texts_per_s"],
                    paired["median_served_req_per_s"],
                    f"{paired['median_p99_ms']:.0f} / {paired['worst_p99_ms']:.0f}"]])


def render_optimize(data: dict[str, Any]) -> list[str]:
    """kiln optimize's results.json: each variant's verdict, speed and agreement, best first."""
    section = data["optimize"]
    reference = section.get("reference_timing")
    ref_ms = 1000 * reference["seconds"] / reference["sequences"] if reference else None
    rows = []
    for name, v in section["variants"].items():
        timing, agreement = v.get("timing"), v.get("agreement") or {}
        ms = 1000 * timing["seconds"] / timing["sequences"] if timing else None
        rows.append([name + (" (best)" if name == section.get("best") else ""), v["status"],
                     f"{ms:.2f}" if ms else "", f"{ref_ms / ms:.2f}x" if ms and ref_ms else "",
                     f"{agreement.get('primary', '')} {agreement.get('value', ''):.4f}" if agreement else "",
                     v.get("reason", "")[:80]])
    rows.sort(key=lambda r: (r[1] != "accepted", r[0]))
    return _table(["variant", "status", "ms a text", "vs PyTorch", "agreement", "reason"], rows)


def render_bound(data: dict[str, Any]) -> list[str]:
    """kiln bench's results.json: each variant's weight-GEMM bound and what it reached."""
    rows = []
    for target in data["targets"]:
        gemm = target.get("gemm")
        if gemm:
            best = max(gemm["int8_bound_per_s"], gemm.get("bf16_bound_per_s") or 0.0)
            rows.append([target["name"], gemm["int8_gops"], gemm["fp32_gops"], gemm.get("bf16_gops"),
                         gemm["int8_bound_per_s"], gemm["reached_per_s"], gemm.get("reached_as", ""),
                         f"{100 * gemm['reached_per_s'] / best:.0f}%"])
    return _table(["variant", "int8 GOP/s", "fp32 GOP/s", "bf16 GOP/s", "int8 bound seq/s", "reached", "as",
                   "of best bound"], rows)


def render_triton(data: dict[str, Any]) -> list[str]:
    """Triton and kiln serve under the same closed-loop load."""
    rows = []
    for name, label in (("triton", f"Triton, buckets {data.get('buckets')}"), ("kiln_serve", "kiln serve")):
        run = data.get(name)
        if run:
            note = f"mean batch {run['model_step_mean_batch']:.2f}" if "model_step_mean_batch" in run else ""
            rows.append([label, run["throughput_per_s"], run["p50_ms"], run["p99_ms"], note])
    return _table(["server", "req/s", "p50 ms", "p99 ms", "notes"], rows) + [
        f"\n{data['clients']} clients, {data['requests']} requests, variant {data['variant']}."]


def render_optimize_speed(data: dict[str, Any]) -> list[str]:
    """The chosen variant against PyTorch, medians of the alternated rounds."""
    medians, variant = data["median"], data["variant"]
    engines = sorted({k.rsplit("_", 1)[0] for k in medians if not k.endswith("_ms")})
    rows = [[e, medians.get(f"{e}_sorted"), medians.get(f"{e}_unsorted"), medians.get(f"{e}_b1_ms")] for e in engines]
    ratios = ", ".join(f"{k.replace('speedup_', '').replace('_', ' ')} {v:.2f}x" for k, v in data.items()
                       if k.startswith("speedup_"))
    return _table(["engine", "sorted seq/s", "unsorted seq/s", "batch-1 ms @128"], rows) + [
        f"\n{variant}: cosine to PyTorch mean {data['cosine_mean']:.4f} / min {data['cosine_min']:.4f}; {ratios}."]


def render_shadow(data: dict[str, Any]) -> list[str]:
    """A loaded server with and without --shadow-rate, and the live figure against offline."""
    live = {k.split("figure=")[1].split('"')[1]: v for k, v in data["live"].items() if "figure=" in k}
    return _table(["server", "req/s (median)", "p99 ms (median)"],
                  [[name, data["median_throughput_per_s"][name], data["median_p99_ms"][name]]
                   for name in ("plain", "shadowed")]) + [
        f"\nshadowed / plain {data['ratio']:.3f} at rate {data['rate']}; live min / mean cosine "
        f"{live.get('min_cosine', float('nan')):.4f} / {live.get('mean_cosine', float('nan')):.4f} against offline "
        f"{data['offline_min_cosine']:.4f} / {data['offline_mean_cosine']:.4f}."]


def render_static(data: dict[str, Any]) -> list[str]:
    """A static student against the teacher's best variant: quality and texts/s."""
    teacher, static = data["teacher"], data["static"]
    return _table(["model", "STS Spearman", "texts/s", "neighbours' recall@10", "pairwise-cosine Spearman"], [
        [f"teacher ({teacher['variant']})", teacher["sts_spearman"], teacher["texts_per_s"], "", ""],
        ["static, as a kiln artifact", static["sts_spearman"], static["artifact_texts_per_s"],
         static["recall_at_10_of_teacher_neighbours"], static["pairwise_cosine_spearman_vs_teacher"]]]) + [
        f"\n{data['artifact_speedup']:.1f}x the teacher's best variant end to end ({data['texts']} texts, best of "
        f"{data['rounds']})."]


def render_embed(data: dict[str, Any]) -> list[str]:
    """kiln embed in one process and on Ray against the offline predictor."""
    return _table(["run", "figures"], [[name, ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                        for k, v in run.items() if not isinstance(v, (dict, list)))]
                                       for name, run in data["runs"].items()]) + [
        f"\n{data['texts']} texts, variant {data['variant']}, {data['cores']} cores."]


def render_speculative(data: dict[str, Any]) -> list[str]:
    """Speculative decoding against greedy: tokens/s, acceptance, identical output."""
    rows = [["greedy", "", data["greedy"]["tokens_per_s"], 1.0, "", True]]
    rows += [[f"draft {s['draft_tokens']} tokens", s["acceptance"], s["tokens_per_s"], s["speedup"],
              s["tokens_per_target_step"], s["identical_to_greedy"]] for s in data["speculative"]]
    return _table(["decoding", "acceptance", "tokens/s", "speed-up", "tokens per target step", "same as greedy"],
                  rows)


def render_gpu(data: dict[str, Any]) -> list[str]:
    """End to end on the GPU against sentence-transformers, with each configuration's min cosine."""
    rows = [[name, run.get("texts_per_s"), f"{run['min_cosine']:.7f}" if "min_cosine" in run else ""]
            for name, run in data["end_to_end"].items()]
    return [f"{data['gpu']}, onnxruntime {data['onnxruntime']}, torch {data['torch']}", "",
            *_table(["configuration", "texts/s", "min cosine to ST fp32"], rows)]


def render_unseen_text(data: dict[str, Any]) -> list[str]:
    from unseen_text import table  # benchmarks/ is the script's directory, so on its path

    return table(data)


def render_families(data: list[dict[str, Any]]) -> list[str]:
    from families import table  # benchmarks/ is the script's directory, so on its path

    return table(data).splitlines()


def render_soak(data: dict[str, Any]) -> list[str]:
    from soak import table  # benchmarks/ is the script's directory, so on its path

    return table(data)


def _script(name: str, *args: str) -> Callable[[argparse.Namespace, Path], list[str]]:
    def command(options: argparse.Namespace, out: Path) -> list[str]:
        filled = [a.format(artifact=options.artifact) for a in args]
        return [str(HERE / name), *filled, "--json", str(out)]
    return command


def _kiln(*args: str) -> Callable[[argparse.Namespace, Path], list[str]]:
    """A kiln command ({artifact}: the artifact option; {work}: the part's own output directory)."""
    def command(options: argparse.Namespace, out: Path) -> list[str]:
        return ["-m", "kiln", *[a.format(artifact=options.artifact, work=out.with_suffix("")) for a in args]]
    return command


ARTIFACT = "an artifact: `make demo` (kiln-out) or --artifact DIR"
PARTS = {p.name: p for p in (
    Part("optimize", "`kiln optimize` on the bundled model",
         _kiln("optimize", "--task", "feature-extraction", "--force", "-o", "{artifact}"),
         "nothing (it writes --artifact)", 10, render_optimize, results="{artifact}/results.json"),
    Part("bound", "The engine against the hardware: weight-GEMM bound",
         _kiln("bench", "{artifact}", "--quick", "--no-sweep", "-o", "{work}"), ARTIFACT, 3, render_bound,
         results="{work}/results.json"),
    Part("peers", "Encoders: kiln against what a user assembles from existing tools",
         _script("peers.py", "{artifact}", "--rounds", "2", "--variants"), ARTIFACT + "; creates three peer venvs", 35,
         render_peers),
    Part("serve-load", "`kiln serve` against offline, alternated",
         _script("serve_load.py", "{artifact}/best", "--paired", "--concurrency", "64", "--rounds", "6"), ARTIFACT, 3,
         render_serve_load),
    Part("soak", "`kiln serve` for an hour of changing shapes: does its memory stay flat?",
         _script("soak.py", "{artifact}/best", "--minutes", "60"), ARTIFACT, 61, render_soak),
    Part("triton-load", "Triton against `kiln serve`", _script("triton_load.py", "{artifact}/best"),
         ARTIFACT + " and `make triton-server`", 5, render_triton),
    Part("shadow", "What live agreement costs a loaded server", _script("shadow_cost.py", "{artifact}/best"), ARTIFACT,
         5, render_shadow),
    Part("optimize-speed", "The chosen variant against PyTorch, alternated",
         _script("optimize_speed.py", "{artifact}", "--rounds", "3"), ARTIFACT, 10, render_optimize_speed),
    Part("optimize-profile", "`kiln optimize` on GPT-2 small's shape, by stage", _script("optimize_profile.py"),
         "nothing", 12, render_generic),
    Part("students", "Students of MiniLM (kiln distill, kiln prune)", _script("distill_minilm.py"), "nothing", 70,
         render_generic),
    Part("static", "A static student against the teacher", _script("static_minilm.py", "{artifact}/best"), ARTIFACT,
         10, render_static),
    Part("rerank", "A trained reranker's variants", _script("rerank_minilm.py"), "nothing", 20, render_generic),
    Part("colbert", "Late interaction against PyLate", _script("colbert_minilm.py"), "`make pylate`", 11,
         render_generic),
    Part("embed", "Bulk embedding, one process and Ray", _script("embed_corpus.py", "--artifact", "{artifact}"),
         ARTIFACT, 15, render_embed),
    Part("slim-install", "The serving install against the full one", _script("slim_install.py"), "`make slim`", 3,
         render_generic),
    Part("decoder-latency", "Decoder latency and continuous batching", _script("decoder_latency.py"), "nothing", 30,
         render_generic),
    Part("decoder-fidelity", "int8 fidelity of a trained decoder", _script("decoder_fidelity.py"), "nothing", 25,
         render_generic),
    Part("speculative", "Speculative decoding against greedy", _script("speculative.py"), "nothing", 30,
         render_speculative),
    Part("gpu", "kiln's GPU paths", _script("gpu_check.py"), "a CUDA GPU", 10, render_gpu),
    Part("unseen-text", "Does the gate's verdict hold on text it never saw?",
         _script("unseen_text.py", "{artifact}"), ARTIFACT, 12, render_unseen_text),
    Part("families", "Embedding families at their real sizes (random weights) against sentence-transformers",
         _script("families.py"), "nothing", 90, render_families),
)}
# decoder_peers.py needs a decoder and its kiln optimize output (optimize_profile.py --keep DIR makes both); run it
# directly: python benchmarks/decoder_peers.py MODEL ARTIFACT --json benchmarks/out/decoder-peers.json


def stamp(part: Part, argv: list[str], artifact: Path) -> dict[str, str]:
    """Where a figure came from: the commit (``-dirty`` with uncommitted changes), the CPU class, the date, the
    command."""
    from kiln.system.cpu import cpu_class, cpu_info

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no")
                                                     else "")
    info = cpu_info()
    shown = ["python", *[str(Path(a).relative_to(ROOT)) if a.startswith(str(ROOT)) else a for a in argv]]
    return {"part": part.name, "commit": commit, "cpu_class": cpu_class(info.features), "cpu": info.model,
            "date": date.today().isoformat(), "command": shlex.join(shown), "artifact": _artifact(artifact)}


def _artifact(path: Path) -> str:
    """What the measured artifact holds, as its manifest says (its best variant, the variants built), or ""."""
    manifest = path / "manifest.json"
    if not manifest.is_file():
        return ""
    body = json.loads(manifest.read_text())
    built = ", ".join(body.get("variants", {}))
    return f"artifact: best {body.get('build', {}).get('best')} of {built}" if built else ""


def run_part(part: Part, options: argparse.Namespace) -> bool:
    out = OUT / f"{part.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = part.command(options, out)
    print(f"== {part.name}: {shlex.join(argv)}", flush=True)
    code = subprocess.run([sys.executable, *argv], cwd=ROOT).returncode
    if code == 0 and part.results:  # kiln's own commands write results.json into their output directory
        source = Path(part.results.format(artifact=options.artifact, work=out.with_suffix("")))
        out.write_text(source.read_text())
    if code != 0:
        print(f"== {part.name} FAILED (exit {code}); its section of RESULTS.md is left as it was", file=sys.stderr)
        return False
    (OUT / f"{part.name}.meta.json").write_text(json.dumps(stamp(part, argv, options.artifact), indent=1) + "\n")
    return True


def section(part: Part) -> tuple[str, list[str]]:
    """(the section's key: the part and the CPU class it ran on, its lines) from the part's last JSON and stamp."""
    meta = json.loads((OUT / f"{part.name}.meta.json").read_text())
    data = json.loads((OUT / f"{part.name}.json").read_text())
    return f"{part.name} {meta['cpu_class']}", [
        f"### {part.title}: {meta['cpu_class']}", "",
        f"`{meta['command']}` ({meta['cpu']}; commit {meta['commit']}, {meta['date']}"
        f"{'; ' + meta['artifact'] if meta.get('artifact') else ''})", "", *part.render(data)]


def write_results(parts: list[Part]) -> None:
    """Replace each part's section for the CPU class it ran on (a figure of another class stays), or add it before
    the closing list of what was tried."""
    text = RESULTS.read_text()
    for part in parts:
        key, lines = section(part)
        body = "\n".join([f"<!-- part: {key} -->", *lines, "<!-- /part -->"])
        pattern = re.compile(rf"<!-- part: {re.escape(key)} -->.*?<!-- /part -->", re.S)
        same_part = list(re.finditer(rf"<!-- part: {re.escape(part.name)} [^>]*-->.*?<!-- /part -->\n", text, re.S))
        if pattern.search(text):
            text = pattern.sub(lambda _match, new=body: new, text)
        elif same_part:  # beside the part's figures on other CPU classes
            end = same_part[-1].end()
            text = text[:end] + "\n" + body + "\n" + text[end:]
        else:
            anchor = text.find("\n## What was tried and closed")
            text = (text[:anchor] + "\n" + body + "\n" + text[anchor:]) if anchor >= 0 else text + "\n" + body + "\n"
    RESULTS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", help=f"parts to run (default: all): {', '.join(PARTS)}")
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    parser.add_argument("--artifact", type=Path, default=ROOT / "kiln-out", help="make demo's output (kiln-out)")
    parser.add_argument("--results", action="store_true", help="rewrite the parts' sections of RESULTS.md")
    parser.add_argument("--render-only", action="store_true", help="do not run: render the parts' last JSON")
    options = parser.parse_args()
    if options.list:
        for part in PARTS.values():
            print(f"{part.name:<17} ~{part.minutes:>3} min  needs {part.needs}\n{'':<17} {part.title}")
        return
    unknown = [p for p in options.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; the parts are: {', '.join(PARTS)}")
    chosen = [PARTS[p] for p in options.parts] or list(PARTS.values())
    done = chosen if options.render_only else [p for p in chosen if run_part(p, options)]
    missing = [p.name for p in done if not (OUT / f"{p.name}.meta.json").is_file()]
    if missing:
        parser.error(f"no results to render for {', '.join(missing)}: run them first")
    if options.results:
        write_results(done)
        print(f"RESULTS.md: {len(done)} section(s) rewritten ({', '.join(p.name for p in done)})")
    sys.exit(0 if len(done) == len(chosen) else 1)


if __name__ == "__main__":
    main()
