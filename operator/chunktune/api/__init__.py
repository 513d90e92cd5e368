"""The ChunkedPrefillTuning API (``chunktune.dev/v1alpha1``): one manifest, read by the local
runner and the operator alike.

- :mod:`.v1alpha1`: the manifest models (camelCase in YAML, snake_case in Python);
- :mod:`.reader`: :func:`parse_manifest`, :func:`load_manifest`, :func:`validate`;
- :mod:`.metrics`: the metric vocabulary; :mod:`.default_space`: the default search space;
- :mod:`.crd`: the CRD generated from the models; :mod:`.status`: the status shape and
  :func:`render_status`; :mod:`.cli`: ``chunktune validate`` and ``chunktune crd``.
"""

from chunktune.api.crd import build_crd
from chunktune.api.metrics import METRICS, Metric
from chunktune.api.reader import load_manifest, parse_manifest, read_manifest, validate
from chunktune.api.status import render_status, set_condition
from chunktune.api.v1alpha1 import (
    ChunkedPrefillTuning,
    Constraint,
    EngineSpec,
    Objective,
    Parameter,
    Spec,
    WorkloadSpec,
)
from chunktune.core.study_records import StudySummary, TrialRecord

__all__ = [
    "METRICS",
    "ChunkedPrefillTuning",
    "Constraint",
    "EngineSpec",
    "Metric",
    "Objective",
    "Parameter",
    "Spec",
    "StudySummary",
    "TrialRecord",
    "WorkloadSpec",
    "build_crd",
    "load_manifest",
    "parse_manifest",
    "read_manifest",
    "render_status",
    "set_condition",
    "validate",
]
