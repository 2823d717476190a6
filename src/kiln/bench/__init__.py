"""kiln bench: latency grid, length-mix throughput, memory, load time and thread sweep per engine."""
