"""torchjob.api."""
