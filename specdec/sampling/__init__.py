"""Sampling: tokens from probabilities, rejection sampling, counter-based random numbers."""
