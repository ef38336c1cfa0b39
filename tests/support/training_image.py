"""A stand-in for a training image without trainsentry: a fresh virtualenv whose Python sees
torch (and the rest of the test environment's packages) but not trainsentry.

The test environment's site-packages is added through a plain path line in a `.pth` file:
Python appends that folder to `sys.path` without reading the `.pth` files inside it, so the
editable install of trainsentry there stays invisible, as in an image that never installed
it. `with_trainsentry=True` adds this checkout too: an image that already carries it.
"""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def training_image(
    folder: Path, *, with_trainsentry: bool = False, sitecustomize: str | None = None
) -> Path:
    """Creates the virtualenv in `folder`; returns its python. `sitecustomize`: the source of
    the image's own sitecustomize.py (in its site-packages)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60
    )
    python = folder / "bin" / "python"
    found = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    own = Path(found.stdout.strip())
    lines = [site.getsitepackages()[0]]
    if with_trainsentry:
        lines.insert(0, str(REPO))
    (own / "training-image.pth").write_text("\n".join(lines) + "\n")
    if sitecustomize is not None:
        (own / "sitecustomize.py").write_text(sitecustomize)
    return python
