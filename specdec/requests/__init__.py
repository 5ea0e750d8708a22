"""A request: its parameters, its sequence, stop conditions, detokenizer and statistics."""
