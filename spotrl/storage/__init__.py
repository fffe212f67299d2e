"""Durable state: atomic files, the versioned weight store, train-state checkpoints, rollout shards."""
