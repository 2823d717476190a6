"""Validation of variants against the fp32 original: agreement, task metrics, and the gate."""
