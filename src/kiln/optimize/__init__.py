"""kiln optimize: build variants from the fp32 export, validate each, keep the fastest that stays correct.

The package is also the function: ``kiln.optimize(model, task=..., ...)`` is :func:`kiln.optimize.run.optimize`.
"""

from kiln.system.modules import make_callable

make_callable(__name__, "kiln.optimize.run", "optimize")
