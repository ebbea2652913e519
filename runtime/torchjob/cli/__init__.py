"""torchjob.cli."""
