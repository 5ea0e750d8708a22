"""Redis for the load monitor: the Redis-backed load store and a local redis-server for demos and tests."""
