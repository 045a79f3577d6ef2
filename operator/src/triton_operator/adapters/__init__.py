"""Imperative shell: Kubernetes and object-store I/O, and the sync engine, behind small interfaces."""
