"""Verifiers and reward functions."""
