# syntax=docker/dockerfile:1
# The chunktune image: the operator (`chunktune operator run`), and what its trials run —
# `chunktune load run` in load Jobs and `chunktune sim serve` for simulated engines.
#
#   docker build -t REGISTRY/chunktune:0.1.0 .     (no chunktune image is published)
#
# Two stages: the first builds the wheel from the sources (pyproject.toml, operator/ and the
# workload profiles it links to), the second installs only that wheel and its runtime
# dependencies, so no source tree, build tool or dev extra ends up in the image.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
# operator/chunktune/profiles links to ../../loadtest/profiles; the wheel ships the profiles.
COPY loadtest/ loadtest/
RUN pip wheel --no-cache-dir --no-deps . -w /wheels

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="chunktune" \
      org.opencontainers.image.description="Kubernetes operator that tunes vLLM chunked-prefill flags by measuring them" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    CHUNKTUNE_PROFILES=/opt/chunktune/loadtest/profiles \
    CHUNKTUNE_LOCUSTFILE=/opt/chunktune/loadtest/locustfile.py \
    CHUNKTUNE_STATE_DIR=/var/lib/chunktune

RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl \
 && groupadd --system --gid 10001 chunktune \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/chunktune --create-home \
      --shell /usr/sbin/nologin chunktune \
 && mkdir -p /var/lib/chunktune \
 && chown 10001:10001 /var/lib/chunktune

COPY --chown=root:root loadtest/ /opt/chunktune/loadtest/

# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
WORKDIR /home/chunktune

# 8000: a simulated engine (`chunktune sim serve`); 8080: the operator's /healthz.
EXPOSE 8000 8080
ENTRYPOINT ["chunktune"]
CMD ["operator", "run", "--all-namespaces"]
