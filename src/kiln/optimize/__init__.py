"""kiln optimize: build variants from the fp32 export, validate each, keep the fastest that stays correct."""
