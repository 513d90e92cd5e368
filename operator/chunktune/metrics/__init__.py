"""Server-side metrics of a trial: vLLM's ``vllm:*`` families, read from a pod's ``/metrics``
(two scrapes, before and after the load) or from Prometheus. Parsing and arithmetic are pure
(:mod:`.promtext`, :mod:`.promql`); :mod:`.client` does the HTTP."""
