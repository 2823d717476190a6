"""The hybrid-embedding task (BGE-M3: a dense vector, lexical weights and ColBERT vectors from one forward), in
parts: ``export``, ``task``, ``validation`` and ``wire`` (which only the servers and integrations import)."""
