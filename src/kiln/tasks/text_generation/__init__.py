"""The text-generation (decoders with a KV cache) task, in two parts: ``task`` (what loading, export, the runtime and
validation need) and ``wire`` (its routes, request and response models, Triton tensors), which only the servers and
integrations import."""
