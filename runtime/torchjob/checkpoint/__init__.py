"""torchjob.checkpoint."""
