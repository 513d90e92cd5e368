"""The tuner core, shared by ``chunktune tune`` and the operator: the search space, the Optuna
study, the loop and the results. No Kubernetes here."""
