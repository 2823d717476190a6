"""Source models: a Hugging Face model directory loaded for one task, and the fp32 PyTorch reference built from it."""
