"""kiln embed: a whole corpus through an embedding artifact into Parquet parts, on one machine or on Ray."""
