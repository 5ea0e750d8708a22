"""Generated gRPC stubs of protos/specdec_rpc/v1/*.proto (made by the package build: `pip install -e .`)."""
