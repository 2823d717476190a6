"""Decoder-only language models (GPT-2, GPT-Neo): the KV-cache graph, generation, and serving's step loop."""
