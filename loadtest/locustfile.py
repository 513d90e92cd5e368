"""Locust entry point for chunktune's load driver (ad-hoc runs and the web UI).

The logic lives in ``chunktune.load`` (``users``, ``locust_entry``); ``chunktune load run`` is the
scripted way to run the same thing. Example::

    locust -f loadtest/locustfile.py --headless -u 1 -r 1 --host http://127.0.0.1:8000 \\
        --chunktune-profile smoke --chunktune-duration 30s --chunktune-out out/smoke.json \\
        --csv out/smoke

The profile (``--chunktune-profile`` or ``$CHUNKTUNE_PROFILE``; default ``smoke``) defines one
Locust User class per traffic class; a single dispatcher user (``-u 1``) replays its arrivals.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import chunktune  # noqa: F401
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from chunktune.load.locust_entry import from_process

globals().update(from_process())
