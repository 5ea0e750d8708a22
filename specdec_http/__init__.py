"""The OpenAI-compatible HTTP API: a thin shim on the core frontend, beside the gRPC one."""
