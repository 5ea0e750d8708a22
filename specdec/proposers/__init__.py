"""Proposers: who drafts (draft model, n-gram, none, composite), their registry and per-row view."""
