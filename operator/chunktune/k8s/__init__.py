"""The Kubernetes operator: ``chunktune operator run``, built on kopf.

This package is the only importer of ``kopf`` and of the ``kubernetes`` client
(``.importlinter``). Its modules:

- :mod:`.settings`: the settings tree, validated once from ``CHUNKTUNE_*`` and the command line;
- :mod:`.kube`: the asynchronous view of the API over the official client;
- :mod:`.state`: what the handlers share, the resource's parsing, and its status writer;
  :mod:`.locations`: where a study's journal and step logs live, what ``spec.storage`` may name;
- :mod:`.live`: the daemon's view of its resource and why a study stops (``StopCause``);
- :mod:`.reporting`: events, conditions and status writes, for the study and the re-tune;
  :mod:`.session`: the storage and trial backend a study runs in, every hook wired;
- :mod:`.controller`: one ``ChunkedPrefillTuning``'s study — the tuner, its phases (no
  kopf); :mod:`.retuner`: the watch of ``spec.retune``; :mod:`.outputs`: ``spec.output``
  (ConfigMap, Deployment patch); :mod:`.policy`: what a tuning may make the operator reference
  or write (Secrets, images, outputs);
- :mod:`.handlers`: the thin kopf handlers (startup, create/update validation, the study
  daemon, the deletion finalizer);
- :mod:`.leader`: leader election over a Lease (one active replica of several);
- :mod:`.operator_metrics`: the operator's Prometheus metrics and its ``/metrics``, ``/healthz``;
- :mod:`.runtime`: builds the registry and runs kopf (as the leader, with leader election);
  :mod:`.cli`: ``chunktune operator run``.
"""
