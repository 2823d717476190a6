"""kiln audit: score any running embedding deployment against the original model and say what explains a gap."""
