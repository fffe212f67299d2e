"""Prefect flows and what a run around them needs: the train flow, where a run resumes, graceful
preemption, the run directory's config and records, Prefect's result storage, the rollout fleet's
worker count per iteration, what a dead process left open, the UI's artifacts, and the private local
Prefect server. The run config is `spotrl.config`, the command line `spotrl.cli`."""
