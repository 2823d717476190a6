"""`kiln audit URL`: score a running embedding, reranker or decoder deployment against the original model
(kiln/auditing)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kiln.choices import WireProtocol
from kiln.cli import console
from kiln.cli.options import DEFAULT_TASK_OPT, AdapterOpt, ModelArg, PickleOpt, TaskOpt
from kiln.tasks import DEFAULT_TASK, task_spec


def audit(
    url: Annotated[str, typer.Argument(help="The deployment's base URL, e.g. http://127.0.0.1:8000.",
                                       show_default=False)],
    model: ModelArg = None,
    task: TaskOpt = DEFAULT_TASK_OPT,
    protocol: Annotated[WireProtocol, typer.Option(
        help="How to ask it: openai (/v1/embeddings; a reranker: Cohere-style /rerank as Infinity and vLLM serve "
        "it; a decoder: /v1/completions), tei (text-embeddings-inference's /embed, /rerank), kiln (kiln serve's "
        "/embed, /rerank), v2 (KServe / Triton /v2/models/NAME/infer with TEXT (and QUERY) tensors).")
    ] = WireProtocol.OPENAI,
    model_name: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="The model's name on the server (OpenAI's 'model', v2's NAME).", show_default=False)] = None,
    texts: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Your traffic, one text per line (at least 8); for a reranker, query<TAB>text lines (a query's lines "
        "together). Default: held-out documentation text of lengths up to past the model's maximum, so truncation "
        "shows.", show_default=False)] = None,
    count: Annotated[int, typer.Option(help="Built-in texts to send (a reranker: that many pairs, 8 per query; a "
                                            "decoder: prompts, at most 32).", min=8)] = 96,
    tolerance: Annotated[Optional[float], typer.Option(  # noqa: UP045
        help="Largest drop allowed: embeddings, min cosine >= 1 - t and mean >= 1 - t/2 (default "
        f"{task_spec(DEFAULT_TASK).validation.default_tolerance:g}); rerankers, the task's own rule (--task's "
        "tolerance, as kiln optimize judges it).", show_default=False)] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each answer.", min=0.1)] = 30.0,
    api_key: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Sent as Authorization: Bearer KEY.", show_default=False)] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where audit.json, audit.md and audit.html go.")]
    = Path("kiln-audit"),
    allow_pickle: PickleOpt = False,
    adapter: AdapterOpt = None,
) -> None:
    """Send texts to a running embedding deployment (or queries to a reranker, prompts to a decoder), score its
    answers against MODEL's fp32 PyTorch outputs by input length, and diagnose a gap by measurement: pooling,
    normalisation, truncation, prefixes, batch drift (rerankers: score activation, pair order, truncation, batch
    drift; decoders: greedy text kept, prompt tokens, determinism).

    Exits 4 when the deployment is outside --tolerance, 3 when it cannot be asked (unreachable, timeout, not
    JSON, wrong shapes).
    """
    from kiln.api.measure import audit as run_audit
    from kiln.auditing.job import OutsideTolerance

    result = run_audit(url, model, task=task.value, protocol=protocol, model_name=model_name, texts=texts, count=count,
                       tolerance=tolerance, timeout=timeout, api_key=api_key, output=output,
                       allow_pickle=allow_pickle, adapter=adapter, progress=console.progress)
    for finding in result.findings:
        console.out.print(f"{finding.cause:<14} {'DIFFERS' if finding.differs else 'same   '} {finding.found}",
                          markup=False)
    console.out.print(f"report: {output.expanduser().resolve() / 'audit.html'}")
    if not result.within_tolerance:
        raise OutsideTolerance(result.verdict())
    console.out.print(result.verdict(), markup=False)
