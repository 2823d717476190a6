"""kiln bench: latency grid, length-mix throughput, memory, load time and thread sweep per engine.

The package is also the function: ``kiln.bench(artifact, ...)`` is :func:`kiln.bench.job.bench`.
"""

from kiln.system.modules import make_callable

make_callable(__name__, "kiln.bench.job", "bench")
