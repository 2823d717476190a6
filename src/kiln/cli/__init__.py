"""kiln's command line."""
