"""Verifiers: the target's side of a round (score drafted tokens, accept, recover, bonus)."""
