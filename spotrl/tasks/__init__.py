"""Thin Prefect tasks, one per stage; they take and return small references, never arrays."""
