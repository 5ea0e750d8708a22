"""Serving: the protocol-free frontend every API shares (requests, streams, auth, leases, drain, status)."""
