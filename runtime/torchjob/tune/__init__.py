"""torchjob.tune."""
