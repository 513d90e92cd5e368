"""Tests of the Helm chart (charts/chunktune), the Dockerfile and the image's contents."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "chunktune"
RELEASE = "chunktune"
NAMESPACE = "chunktune"
KUBE_VERSION = "v1.32.0"
#: The image repository the tests install with (no chunktune image is published, so a release
#: must name one; the render fixtures set this one unless the values name another).
REPOSITORY = "registry.example/chunktune"
