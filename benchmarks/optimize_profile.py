"""``kiln optimize`` profiled by stage: wall time and memory, on GPT-2 small's or Qwen3-0.6B's shape or on the
bundled MiniLM.

``--model gpt2-small`` (the default) is benchmarks/decoder_latency.py's decoder (12 layers, 768 wide, 50,257-token
vocabulary, random weights) with ``--task text-generation``; ``--model qwen3-0.6b`` is Qwen3-0.6B's shape (28 layers,
1,024 wide, 16 query heads over 8 key/value heads of 128, 151,936-token vocabulary, tied; random weights) with
``--task text-generation``; ``--model minilm`` is what ``make demo`` runs (the bundled
all-MiniLM-L6-v2, ``--task feature-extraction``). The optimize run happens in this process with kiln's own progress
messages; each message closes the stage the previous one opened, and a sampler thread reads the resident memory
(VmRSS) every 0.2 s, so each stage gets its seconds and its peak memory (and the process's peak so far, VmHWM, which
no sampler misses), and the run its total and its peak.

    python benchmarks/optimize_profile.py [--model minilm] [--label after] [--json out.json]

The JSON keeps one entry per label, so a before and an after run sit side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"  # results land here (gitignored), not in the tree

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # decoder_latency.py beside this script


QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, intermediate_size=3072, max_position_embeddings=40960,
                 rope_theta=1000000.0, tie_word_embeddings=True)  # Qwen3-0.6B's config.json


def _status(field: str) -> int:
    """A /proc/self/status field in MiB (VmRSS now, VmHWM the peak so far)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return 0


class Stages:
    """Progress messages as stage boundaries, with the peak resident memory seen inside each stage."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.rows: list[dict] = []
        self.current, self.peak = "start", _status("VmRSS")
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, _status("VmRSS"))

    def __call__(self, message: str) -> None:
        now = time.perf_counter()
        self.peak = max(self.peak, _status("VmRSS"))
        # VmHWM, the process's peak so far, catches what the 0.2 s sampler misses (the ONNX export's brief peak):
        # the stage where it rises is the stage that set it.
        hwm = _status("VmHWM")
        self.rows.append({"stage": self.current, "seconds": round(now - self.last, 1), "peak_rss_mib": self.peak,
                          "peak_so_far_mib": hwm})
        print(f"[{now - self.start:7.1f}s {self.peak:6d} MiB, peak so far {hwm:6d}] {message}", flush=True)
        self.current, self.last, self.peak = message, now, _status("VmRSS")

    def close(self) -> dict:
        self("done")
        self._stop.set()
        return {"seconds": round(time.perf_counter() - self.start, 1), "peak_rss_mib": _status("VmHWM"),
                "stages": self.rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("gpt2-small", "qwen3-0.6b", "minilm"), default="gpt2-small")
    parser.add_argument("--label", default="run")
    parser.add_argument("--json", "--output", dest="output", type=Path, default=OUT / "optimize_profile.json")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="copy the model and the optimize output here")
    args = parser.parse_args()

    from decoder_latency import build_model

    import kiln
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob
    from kiln.system.cpu import cpu_info

    with tempfile.TemporaryDirectory() as scratch:
        if args.model == "minilm":  # model None: the bundled one, as `make demo` runs it
            model, task = None, "feature-extraction"
        elif args.model == "qwen3-0.6b":
            from kiln.tasks import TaskName
            from kiln.testing.factory import build_tiny_model

            model, task = str(build_tiny_model("qwen3", TaskName.TEXT_GENERATION, Path(scratch) / "qwen3",
                                               shape=QWEN3_06B)), "text-generation"
        else:
            model, task = str(build_model(Path(scratch) / "gpt2-small")), "text-generation"
        stages = Stages()
        config = OptimizeConfig(model=model, task=task, output=Path(scratch) / "opt", threads=args.threads)
        summary = OptimizeJob(config, stages).run()
        profile = stages.close()
        variants = {o.name: {"status": o.status.value, "reason": o.reason,
                             "ms_per_text": round(o.timing.ms_per_sequence, 1) if o.timing else None}
                    for o in summary.outcomes}
        best = summary.best
        if args.keep is not None:
            import shutil

            if model is not None:
                shutil.copytree(model, args.keep / "model", dirs_exist_ok=True)
            shutil.copytree(config.output, args.keep / "opt", dirs_exist_ok=True)
    previous = json.loads(args.output.read_text()) if args.output.is_file() else {}
    previous[f"{args.model}:{args.label}"] = {"command": "python " + " ".join(sys.argv), "kiln": kiln.__version__,
                            "cpu": cpu_info().to_dict(), **profile, "variants": variants, "best": best}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(previous, indent=1) + "\n")
    print(f"-> {args.output} [{args.model}:{args.label}]: {profile['seconds']} s, peak {profile['peak_rss_mib']} MiB")


if __name__ == "__main__":
    main()
