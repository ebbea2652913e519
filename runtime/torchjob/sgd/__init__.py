"""torchjob.sgd."""
