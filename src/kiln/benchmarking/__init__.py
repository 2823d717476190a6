"""kiln bench: latency grid, length-mix throughput, memory, load time and thread sweep per engine. The function
users call is ``kiln.benchmarking`` (kiln.api.measure)."""
