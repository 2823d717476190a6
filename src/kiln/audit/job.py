"""`kiln audit URL`: texts to the deployment, the original's fp32 vectors beside them, the diagnosis, the report.

Writes audit.json (typed, kiln.records), audit.md and audit.html (the report page's style) into the output
directory and returns the result; the CLI exits 4 when the deployment is outside tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path

from kiln.audit.diagnose import AuditResult, diagnose
from kiln.audit.protocols import Endpoint
from kiln.errors import KilnError, UsageError
from kiln.records import write_json
from kiln.tasks import DEFAULT_TASK

SCHEMA = "kiln.audit/1"


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

    def __post_init__(self) -> None:
        if self.count < 8:
            raise UsageError(f"--count must be at least 8 (got {self.count})")


def _texts(config: AuditConfig, reference) -> list[str]:
    if config.texts_file is not None:
        path = config.texts_file.expanduser()
        if not path.is_file():
            raise UsageError(f"--texts file {path} does not exist")
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if len(lines) < 8:
            raise UsageError(f"--texts file {path} needs at least 8 non-empty lines (got {len(lines)})")
        return lines
    from kiln.data import corpus
    from kiln.data.texts import texts_of_lengths

    top = reference.configured.max_length + 64  # some past the model's maximum: truncation shows there
    step = max(1, (top - 8) // config.count)
    return texts_of_lengths([8 + i * step for i in range(config.count)], seed=5,
                            token_count=lambda t: reference.token_counts([t])[0],
                            source=corpus.sentences("held-out"))


def run_audit(config: AuditConfig, progress: Callable[[str], None] = lambda _: None) -> AuditResult:
    from kiln.audit.reference import Reference
    from kiln.model.source import load_source
    from kiln.validation.gate import tolerance_for

    progress(f"loading the original {config.model or 'bundled all-MiniLM-L6-v2'} (fp32, PyTorch)")
    source = load_source(config.model, DEFAULT_TASK, allow_pickle=config.allow_pickle)
    reference = Reference(source)
    texts = _texts(config, reference)
    progress(f"sending {len(texts)} texts to {config.endpoint.url} ({config.endpoint.protocol.value})")
    result = diagnose(config.endpoint, reference, texts, tolerance_for(DEFAULT_TASK, config.tolerance), source.name)
    write_audit(config.output.expanduser(), result)
    return result


def write_audit(directory: Path, result: AuditResult) -> None:
    """audit.json, and audit.md / audit.html in the report's style (kiln.report.html), each written atomically."""
    from kiln.report.html import html_table, markdown_table, page, write_pages

    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "audit.json", SCHEMA, result)
    buckets = (["tokens", "texts", "mean cosine", "min cosine"],
               [[b.tokens, str(b.count), f"{b.mean:.4f}", f"{b.min:.4f}"] for b in result.buckets])
    findings = (["cause", "vs the original", "measured"],
                [[f.cause, "differs" if f.differs else "same", f.found] for f in result.findings])
    about = (f"Original: {result.model} ({result.configured}); protocol {result.protocol}; {result.texts} texts; "
             f"tolerance {result.tolerance:g}.")
    lines = [f"# kiln audit: {result.url}", "", about, "", f"**Verdict:** {result.verdict()}.", "",
             *markdown_table(buckets), *markdown_table(findings)]
    html = page("kiln audit", [f"<h1>kiln audit: {escape(result.url)}</h1>", f"<p>{escape(about)}</p>",
                               f"<p><strong>Verdict:</strong> {escape(result.verdict())}.</p>",
                               "<h2>Agreement by input length</h2>", html_table(buckets), "<h2>Diagnosis</h2>",
                               html_table(findings)])
    write_pages(directory, {"audit.md": "\n".join(lines), "audit.html": html})
