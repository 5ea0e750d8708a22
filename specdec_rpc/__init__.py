"""gRPC shell of specdec: generated stubs (v1/), codecs, servicers and clients."""
