"""Making the model itself smaller: students distilled from their teacher (kiln distill), judged against it."""
