#!/usr/bin/env python3
"""Write crds/torchjob.io_torchjobs.yaml from torchjob.api (run by `make crds`)."""

from __future__ import annotations

import pathlib
import sys

from torchjob.api.crd import render_crd_yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET = ROOT / "crds" / "torchjob.io_torchjobs.yaml"
CHART_COPY = ROOT / "charts" / "torchjob-operator" / "crds" / "torchjob.io_torchjobs.yaml"


def main() -> int:
    text = render_crd_yaml()
    for path in (TARGET, CHART_COPY):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
