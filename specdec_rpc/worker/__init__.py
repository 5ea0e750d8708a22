"""The internal worker protocol: servicers, their clients in the router, leases, reconnects, codecs."""
