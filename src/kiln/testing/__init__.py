"""Helpers that build what kiln's tests and benchmarks measure, with nothing downloaded: tiny random-weight models
of every supported architecture with locally trained tokenizers (``factory``), and small task heads fine-tuned on the
bundled MiniLM over generated data (``finetune``). They import torch and transformers; kiln itself never imports
this package."""
