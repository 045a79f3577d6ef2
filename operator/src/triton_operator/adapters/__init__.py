"""Imperative shell: Kubernetes, object stores and Triton I/O behind small interfaces."""
