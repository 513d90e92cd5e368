"""The Kubernetes operator: ``chunktune operator run``, built on kopf.

This package is the only importer of ``kopf`` and of the ``kubernetes`` client
(``.importlinter``). Its modules:

- :mod:`.settings`: the settings tree, validated once from ``CHUNKTUNE_*`` and the command line;
- :mod:`.kube`: the asynchronous view of the API over the official client;
- :mod:`.state`: what the handlers share, the resource's parsing, and its status writer;
- :mod:`.controller`: one ``ChunkedPrefillTuning``'s study — the tuner, its phases, events (no
  kopf); :mod:`.outputs`: ``spec.output`` (ConfigMap, Deployment patch); :mod:`.policy`: what a
  tuning may make the operator reference or write (Secrets, images, outputs);
- :mod:`.handlers`: the thin kopf handlers (startup, create/update validation, the study
  daemon, the deletion finalizer);
- :mod:`.leader`: leader election over a Lease (one active replica of several);
- :mod:`.metrics`: the operator's Prometheus metrics and its ``/metrics``, ``/healthz``;
- :mod:`.runtime`: builds the registry and runs kopf (as the leader, with leader election);
  :mod:`.cli`: ``chunktune operator run``.
"""
