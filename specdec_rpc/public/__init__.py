"""The public gRPC API: service, client, TLS, proxy binding, status codes."""
