"""torchjob.train."""
