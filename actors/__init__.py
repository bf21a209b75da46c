"""Ray actor classes, one per model stage, and the executor that streams batches through them."""
