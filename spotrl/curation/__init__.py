"""Prompt datasets: built-in tasks, schemas, splits."""
