"""The `specdec` command: `generate` (the core's, in-process), `serve` (Ray), `client` and `status` (gRPC)."""
