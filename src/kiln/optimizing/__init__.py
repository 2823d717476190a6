"""kiln optimize: build variants from the fp32 export, validate each, keep the fastest that stays correct. The
function users call is ``kiln.optimizing`` (kiln.api.build)."""
