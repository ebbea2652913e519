"""torchjob.client."""
