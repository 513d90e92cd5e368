"""Where a trial's engine runs: in process (``simulated``), as local processes (``local``) or
as Pods in a cluster (``kubernetes``). One protocol (:class:`~.base.TrialBackend`), one shared
contract test suite (``tests/contract``)."""
