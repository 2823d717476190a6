"""Measuring from Python: ``kiln.bench`` (an artifact's speed against PyTorch on this machine) and ``kiln.audit``
(any running deployment's answers against the original model). The CLI's ``kiln bench`` and ``kiln audit`` are made
of these functions, with the same parameters as their options.

Each function imports its job when called, so that `import kiln` stays free of torch, transformers and the server's
packages (a serving install has no torch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.choices import WireProtocol
from kiln.tasks import DEFAULT_TASK, task_spec

if TYPE_CHECKING:
    from kiln.auditing.result import AuditResult
    from kiln.benchmarking.compare import Change
    from kiln.records.bench import BenchResults

Progress = Callable[[str], None]


def bench(target: str | Path | None = None, *, task: str = DEFAULT_TASK, output: str | Path = "kiln-bench",
          variants: Sequence[str] | None = None, batch_sizes: Sequence[int] | None = None,
          seq_lens: Sequence[int] | None = None, texts: str | Path | None = None, lengths: str | Path | None = None,
          threads: int | None = None, quick: bool = False, sweep: bool = True, progress: Progress = lambda _: None,
          progress_bar: Callable[..., object] | None = None) -> BenchResults:
    """``kiln bench``: time ``target`` (an artifact directory, a model directory for PyTorch alone, or None for the
    bundled MiniLM) against the PyTorch fp32 baseline, each in its own process: the latency grid (``batch_sizes`` x
    ``seq_lens``), the length mix, memory, load time and, with ``sweep``, sessions x threads x batch size, whose
    fastest point is written into the artifact as its serving default. Writes results.json, report.html and report.md
    to ``output`` and returns the results."""
    from kiln.benchmarking.job import BenchConfig, BenchJob

    config = BenchConfig(target=str(target) if target is not None else None, output=Path(output),
                         variants=tuple(variants) if variants else None,
                         batch_sizes=tuple(batch_sizes) if batch_sizes else None,
                         seq_lens=tuple(seq_lens) if seq_lens else None, texts_file=Path(texts) if texts else None,
                         lengths_file=Path(lengths) if lengths else None, threads=threads, quick=quick,
                         task=task_spec(task).name, sweep=sweep)
    return BenchJob(config, progress, progress_bar).run()


def compare_results(old: str | Path, new: str | Path, noise: float = 0.10) -> list[Change]:
    """``kiln bench --compare OLD NEW``: the figures of two results.json files that moved by more than ``noise``."""
    from kiln.benchmarking.compare import compare, load

    return compare(load(Path(old)), load(Path(new)), noise)


def audit(url: str, model: str | Path | None = None, *, task: str = DEFAULT_TASK,
          protocol: WireProtocol | str = WireProtocol.OPENAI, model_name: str | None = None,
          texts: str | Path | None = None, count: int = 96, tolerance: float | None = None, timeout: float = 30.0,
          api_key: str | None = None, output: str | Path = "kiln-audit", allow_pickle: bool = False,
          adapter: str | None = None, progress: Progress = lambda _: None) -> AuditResult:
    """``kiln audit``: send texts (a reranker's queries, a decoder's prompts) to the deployment at ``url`` over
    ``protocol``, score its answers against ``model``'s fp32 PyTorch outputs by input length, and diagnose a gap by
    measurement (pooling, normalisation, truncation, prefixes, batch drift; a decoder's greedy text kept, prompt
    tokens, determinism). Writes audit.json, audit.md and audit.html to ``output``;
    ``result.within_tolerance`` says whether the deployment is within ``tolerance``. ``adapter``: the task LoRA
    adapter the deployment merged (kiln.source.adapters), for a model that carries several."""
    from kiln.auditing.job import AuditConfig, run_audit
    from kiln.auditing.protocols import Endpoint
    from kiln.choices import parse_choice

    endpoint = Endpoint(url, parse_choice(WireProtocol, protocol, "protocol"), model_name, timeout,
                        (("Authorization", f"Bearer {api_key}"),) if api_key else ())
    return run_audit(AuditConfig(endpoint, str(model) if model is not None else None, Path(texts) if texts else None,
                                 count, tolerance, Path(output), allow_pickle, task_spec(task).name, adapter),
                     progress)
