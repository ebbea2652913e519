"""torchjob.launch."""
