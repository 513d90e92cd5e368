"""Tests of the Helm chart (charts/chunktune), the Dockerfile and the image's contents."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "chunktune"
RELEASE = "chunktune"
NAMESPACE = "chunktune"
KUBE_VERSION = "v1.32.0"
