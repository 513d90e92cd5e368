"""The Kubernetes operator: ``chunktune operator run``, built on kopf.

This package is the only importer of ``kopf`` (and, with :mod:`chunktune.backends.kubernetes`,
of the ``kubernetes`` client). Its modules:

- :mod:`.settings`: the settings tree, validated once from ``CHUNKTUNE_*`` and the command line;
- :mod:`.kube`: the asynchronous view of the API over the official client;
- :mod:`.study`: one ``ChunkedPrefillTuning``'s study — the tuner, its status, events and
  outputs (no kopf);
- :mod:`.handlers`: the thin kopf handlers (startup, create/update validation, the study
  daemon, the deletion finalizer);
- :mod:`.runtime`: builds the registry and runs kopf; :mod:`.cli`: ``chunktune operator run``.
"""
