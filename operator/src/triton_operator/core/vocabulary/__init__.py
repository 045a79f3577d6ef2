"""What status and Events say: condition types, reasons and helpers, and Triton's per-model states."""
