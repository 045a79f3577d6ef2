"""The reconcile layer: pinning, route writing, one reconcile pass, and the per-object scheduler."""
