"""torchjob: distributed PyTorch training on a laptop and on Kubernetes.

The import package ``torchjob`` is what runs inside training containers and on
a laptop. ``torchjob.api`` and ``torchjob.contract`` never import torch, so the
operator (``torchjob_operator``) can use them in an image without torch.
"""

__version__ = "0.1.0"
