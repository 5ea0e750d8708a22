"""Prometheus metrics exported through Ray's metrics agent."""
