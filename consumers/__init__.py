"""Recovery consumer, reconciler, approvals and provider adapters."""
