"""Provider adapters: the protocol, the bundled fake and the HTTP Idempotency-Key adapter."""
