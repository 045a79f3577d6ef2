"""`triton-operator sync`'s engine: results, hashing, progress, file helpers and the download engine."""
