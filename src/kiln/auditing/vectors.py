"""What `kiln audit` measures of an embedding deployment's vectors against the original, and which cause explains a gap.

Every cause is tested by measurement, not guessed:
- pooling: which pooling of the original's token states (mean, CLS, last token, max) the served vectors match;
- normalisation: whether the served vectors have unit length, against what the model's configuration asks;
- truncation: the truncation length at which the original's vectors match the served ones best on long texts;
- prefix: whether a usual instruction prefix ("query: ", ...) added to every text explains them;
- batch drift: the same texts sent alone and inside batches.
A cause *explains* the gap when the original, computed that way, agrees with the deployment within tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.auditing.protocols import AuditError, Endpoint, embed
from kiln.auditing.reference import POOLINGS, TRUNCATIONS, Reference, cosines, truncations
from kiln.auditing.result import AuditResult, Finding, buckets
from kiln.tasks.validation import length_bound

PREFIXES = ("query: ", "passage: ", "search_query: ", "search_document: ",
            "Represent this sentence for searching relevant passages: ")
UNIT = 1e-3  # |norm - 1| below this counts as normalized


def served_vectors(endpoint: Endpoint, texts: Sequence[str], batch: int = 16) -> np.ndarray:
    return np.concatenate([embed(endpoint, texts[i : i + batch]) for i in range(0, len(texts), batch)])


def diagnose(endpoint: Endpoint, reference: Reference, texts: Sequence[str], tolerance: float, model: str,
             task: str, alone: int = 24) -> AuditResult:
    configured = reference.configured
    lengths = reference.token_counts(texts)
    served = served_vectors(endpoint, texts)
    original = reference.vectors(texts, configured)
    if served.shape[1] != original.shape[1]:
        raise AuditError(f"{endpoint.url} returns {served.shape[1]}-dimensional vectors; {model} makes "
                         f"{original.shape[1]}: it serves another model (or cuts Matryoshka dimensions)")
    agree = cosines(served, original)
    findings, recipe = [], configured

    pooling_scores = {p: float(cosines(served, reference.vectors(texts, configured.but(pooling=p))).mean())
                      for p in POOLINGS}
    pooling = max(pooling_scores, key=pooling_scores.get)
    if pooling_scores[pooling] - pooling_scores[configured.pooling] > 1e-4:
        recipe = recipe.but(pooling=pooling)
    findings.append(Finding("pooling", f"{pooling} (mean cosine {pooling_scores[pooling]:.4f}; configured "
                            f"{configured.pooling}: {pooling_scores[configured.pooling]:.4f})",
                            recipe.pooling != configured.pooling, pooling_scores[pooling]))

    norms = np.linalg.norm(served, axis=1)
    unit = bool(np.all(np.abs(norms - 1) < UNIT))
    normalisation_differs = unit != configured.normalize
    findings.append(Finding("normalisation", f"{'unit vectors' if unit else 'not normalized'} (norm "
                            f"{norms.min():.4f}-{norms.max():.4f}; the original is "
                            f"{'normalized' if configured.normalize else 'not normalized'})",
                            normalisation_differs, float(norms.mean())))

    long_ones = [i for i, n in enumerate(lengths) if n > min(TRUNCATIONS)]
    if long_ones:
        subset = [texts[i] for i in long_ones]
        candidates = truncations(configured.max_length, reference.limit, max(lengths))
        scores = {t: float(cosines(served[long_ones], reference.vectors(subset, recipe.but(max_length=t))).mean())
                  for t in candidates}
        length = max(scores, key=scores.get)
        if scores[length] - scores[configured.max_length] > 1e-4:
            recipe = recipe.but(max_length=length)
        findings.append(Finding("truncation", f"{recipe.max_length} tokens (mean cosine {scores[length]:.4f} on the "
                                f"{len(long_ones)} texts over {min(TRUNCATIONS)} tokens; at the configured "
                                f"{configured.max_length}: {scores[configured.max_length]:.4f})",
                                recipe.max_length != configured.max_length, scores[length]))

    few = list(texts[:alone])
    base = float(cosines(served[: len(few)], reference.vectors(few, recipe)).mean())
    prefix_scores = {p: float(cosines(served[: len(few)], reference.vectors(few, recipe.but(prefix=p))).mean())
                     for p in PREFIXES}
    prefix = max(prefix_scores, key=prefix_scores.get)
    if prefix_scores[prefix] - base > 1e-3:
        recipe = recipe.but(prefix=prefix)
    findings.append(Finding("prefix", f"{prefix!r} added to every text (mean cosine {prefix_scores[prefix]:.4f} "
                            f"against {base:.4f} without)" if recipe.prefix else
                            f"none (the best prefix tried, {prefix!r}, gives {prefix_scores[prefix]:.4f} against "
                            f"{base:.4f} without)", bool(recipe.prefix), prefix_scores[prefix]))

    singles = np.concatenate([embed(endpoint, [t]) for t in few])
    drift = float(np.abs(singles - served[: len(few)]).max())
    drift_cos = float(cosines(singles, served[: len(few)]).min())
    findings.append(Finding("batch drift", "none: the same vectors alone and in batches" if drift == 0 else
                            f"max abs diff {drift:.1e}, min cosine {drift_cos:.6f} between a text sent alone and in a "
                            "batch of 16", drift_cos < 1 - tolerance / 10, drift))

    floor = 1 - tolerance
    # The gate's margin in its words: the cosine a log-normal fit puts 99.9% of texts like these, of each length, at
    # (95% confidence), held to the floor too.
    bound = length_bound(agree, lengths)
    figures = {} if bound is None else {"cosine_bound": bound}
    within = float(agree.min()) >= floor and float(agree.mean()) >= 1 - tolerance / 2 and \
        not normalisation_differs and (bound is None or bound >= floor)
    explained: tuple[str, ...] = ()
    explained_min = None
    normalisation = ("normalisation",) if normalisation_differs else ()
    if recipe != configured:  # the original computed the way the deployment seems to: does it agree then?
        explained_min = float(cosines(served, reference.vectors(texts, recipe)).min())
        changed = [c for c, field in (("pooling", "pooling"), ("truncation", "max_length"), ("prefix", "prefix"))
                   if getattr(recipe, field) != getattr(configured, field)]
        explained = (*changed, *normalisation) if explained_min >= floor else ()
    elif normalisation:
        explained = normalisation
    return AuditResult(endpoint.url, endpoint.protocol.value, task, model, configured.describe(), len(texts),
                       tolerance, "cosine", float(agree.min()), float(agree.mean()), floor, buckets(lengths, agree),
                       tuple(findings), explained, explained_min, within, figures)

