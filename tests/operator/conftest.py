"""Makes `tests/kube_emulator.py` importable as `kube_emulator` from the operator's tests."""

import sys
from pathlib import Path

_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
