"""Prompt datasets in, curated splits out: sources, schema, quarantine, dedup, decontamination, mixing, difficulty."""
