"""setup.py's compile-flag helpers for the build tests, loaded without running setup()."""
from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_setup():
    """setup.py as a module under another name (its ``main()`` runs only as ``__main__``)."""
    spec = importlib.util.spec_from_file_location("uqr_setup_flags", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
