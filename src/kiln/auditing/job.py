"""`kiln audit URL`: inputs to the deployment, the original's fp32 outputs beside them, the diagnosis, the report.

One audit kind per kind of answer (vectors for an embedding task, scores for a reranker), picked from the task
spec; each has its reference (the original run eagerly), its inputs and its diagnosis. Writes audit.json (typed,
kiln.records), audit.md and audit.html (the report page's style) into the output directory and returns the
result; the CLI exits 4 when the deployment is outside tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from kiln.auditing.protocols import Endpoint
from kiln.auditing.result import AuditResult
from kiln.choices import Scheduling
from kiln.errors import KilnError, UsageError
from kiln.records import write_json
from kiln.tasks import DEFAULT_TASK, TASKS, task_spec

SCHEMA = "kiln.audit/2"  # /1 had min_cosine/mean_cosine; /2 names its agreement figure (cosine, kendall tau)


class OutsideTolerance(KilnError):
    """The deployment's vectors are not within tolerance of the original's."""

    exit_code = 4


@dataclass(frozen=True)
class AuditConfig:
    endpoint: Endpoint
    model: str | None = None  # the original: a model directory, a hub id, or None for the bundled MiniLM
    texts_file: Path | None = None  # your traffic, one text per line; default: built-in held-out texts
    count: int = 96  # built-in texts (lengths up to past the model's maximum)
    tolerance: float | None = None  # default: feature-extraction's
    output: Path = Path("kiln-audit")
    allow_pickle: bool = False
    task: str = DEFAULT_TASK  # an embedding task or a reranker (see AUDITS)
    adapter: str | None = None  # the task LoRA adapter to merge into the original (kiln.source.adapters)

    def __post_init__(self) -> None:
        if self.count < 8:
            raise UsageError(f"count must be at least 8 (got {self.count})")
        audit_kind(self.task)  # refuse a task kiln audit cannot check, naming the ones it can
        if task_spec(self.task).scheduling in AUDITS_BY_SCHEDULING:  # before the original is loaded and run
            from kiln.auditing.protocols import require_completer

            require_completer(self.endpoint.protocol)


def _lines(config: AuditConfig) -> list[str]:
    path = config.texts_file.expanduser()
    if not path.is_file():
        raise UsageError(f"texts file {path} does not exist")
    lines = [line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(lines) < 8:
        raise UsageError(f"texts file {path} needs at least 8 non-empty lines (got {len(lines)})")
    return lines


def _texts(config: AuditConfig, reference) -> list[str]:
    if config.texts_file is not None:
        return [line.strip() for line in _lines(config)]
    from kiln.data import corpus
    from kiln.data.texts import texts_of_lengths

    top = reference.configured.max_length + 64  # some past the model's maximum: truncation shows there
    step = max(1, (top - 8) // config.count)
    return texts_of_lengths([8 + i * step for i in range(config.count)], seed=5,
                            token_count=lambda t: reference.token_counts([t])[0],
                            source=corpus.sentences("held-out"))


def _queries(config: AuditConfig, reference) -> list[Any]:
    from kiln.auditing.ranking import builtin_queries, queries_from_lines

    if config.texts_file is not None:
        return queries_from_lines(_lines(config), f"--texts file {config.texts_file}")
    return builtin_queries(reference, config.count)


@dataclass(frozen=True)
class AuditKind:
    """How one kind of answer is audited: the original's reference, the inputs to send, the diagnosis."""

    reference: Callable[[Any], Any]  # source model -> reference
    inputs: Callable[[AuditConfig, Any], Sequence[Any]]  # (config, reference) -> texts or queries
    diagnose: Callable[..., AuditResult]  # (endpoint, reference, inputs, tolerance, model, task) -> result
    what: str  # the inputs, in words


def _vectors() -> AuditKind:
    from kiln.auditing import vectors
    from kiln.auditing.reference import Reference

    return AuditKind(Reference, _texts, vectors.diagnose, "texts")


def _scores() -> AuditKind:
    from kiln.auditing import ranking

    return AuditKind(ranking.ScoreReference, _queries, ranking.diagnose, "queries")


def _prompts(config: AuditConfig, reference) -> list[str]:
    from kiln.auditing.generation import builtin_prompts

    if config.texts_file is not None:
        return [line.strip() for line in _lines(config)]
    return builtin_prompts(reference, min(config.count, GENERATION_PROMPTS))


def _greedy() -> AuditKind:
    from kiln.auditing import generation

    return AuditKind(generation.GreedyReference, _prompts, generation.diagnose, "prompts")


# Built-in prompts for a decoder: each is continued token by token in PyTorch before it is sent, so fewer than the
# texts of an embedding audit.
GENERATION_PROMPTS = 32

# Audit kind, by what the task spec says its results are (TaskSpec.embeds / .ranks) or how it runs (a decoding
# task's greedy text): imported when used, since each pulls torch in through its reference.
AUDITS: dict[str, Callable[[], AuditKind]] = {"embeds": _vectors, "ranks": _scores}
AUDITS_BY_SCHEDULING: dict[Scheduling, Callable[[], AuditKind]] = {Scheduling.DECODE: _greedy}


def _kind_of(spec) -> Callable[[], AuditKind] | None:
    return AUDITS_BY_SCHEDULING.get(spec.scheduling) or next(
        (kind for flag, kind in AUDITS.items() if getattr(spec, flag)), None)


def audit_kind(task: str) -> Callable[[], AuditKind]:
    found = _kind_of(task_spec(task))
    if found is None:
        can = ", ".join(name for name, s in TASKS.items() if _kind_of(s) is not None)
        raise UsageError(f"task {task}: kiln audit checks embedding, reranker and generation deployments ({can})")
    return found


def run_audit(config: AuditConfig, progress: Callable[[str], None] = lambda _: None) -> AuditResult:
    from kiln.source.loading import load_source
    from kiln.validation.gate import tolerance_for

    kind = audit_kind(config.task)()
    progress(f"loading the original {config.model or 'bundled all-MiniLM-L6-v2'} (fp32, PyTorch)")
    source = load_source(config.model, config.task, allow_pickle=config.allow_pickle, adapter=config.adapter)
    reference = kind.reference(source)
    inputs = kind.inputs(config, reference)
    progress(f"sending {len(inputs)} {kind.what} to {config.endpoint.url} ({config.endpoint.protocol.value})")
    result = kind.diagnose(config.endpoint, reference, inputs, tolerance_for(config.task, config.tolerance),
                           source.name, config.task)
    write_audit(config.output.expanduser(), result)
    return result


COUNTED = {"cosine": "texts", "greedy agreement": "prompts"}  # what one bucket entry is, by agreement figure


def write_audit(directory: Path, result: AuditResult) -> None:
    """audit.json, and audit.md / audit.html in the report's style (kiln.report.html), each written atomically."""
    from kiln.report.html import html_table, markdown_table, page, write_pages

    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "audit.json", SCHEMA, result)
    counted = COUNTED.get(result.agreement, "queries")  # a tau is per query, a cosine per text
    buckets = (["tokens", counted, f"mean {result.agreement}", f"min {result.agreement}"],
               [[b.tokens, str(b.count), f"{b.mean:.4f}", f"{b.min:.4f}"] for b in result.buckets])
    findings = (["cause", "vs the original", "measured"],
                [[f.cause, "differs" if f.differs else "same", f.found] for f in result.findings])
    figures = (["figure", "value"],
               [[name.replace("_", " "), f"{value:.4g}"] for name, value in result.figures.items()])
    about = (f"Original: {result.model}, {result.task} ({result.configured}); protocol {result.protocol}; "
             f"{result.inputs} inputs; tolerance {result.tolerance:g}.")
    lines = [f"# kiln audit: {result.url}", "", about, "", f"**Verdict:** {result.verdict()}.", "",
             *markdown_table(buckets), *(markdown_table(figures) if result.figures else []), *markdown_table(findings)]
    html = page("kiln audit", [f"<h1>kiln audit: {escape(result.url)}</h1>", f"<p>{escape(about)}</p>",
                               f"<p><strong>Verdict:</strong> {escape(result.verdict())}.</p>",
                               "<h2>Agreement by input length</h2>", html_table(buckets),
                               *(["<h2>Figures</h2>", html_table(figures)] if result.figures else []),
                               "<h2>Diagnosis</h2>", html_table(findings)])
    write_pages(directory, {"audit.md": "\n".join(lines), "audit.html": html})
