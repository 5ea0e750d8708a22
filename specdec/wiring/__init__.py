"""Wiring: configuration in, a running engine out (builders, start-up checks, the in-process CLI)."""
