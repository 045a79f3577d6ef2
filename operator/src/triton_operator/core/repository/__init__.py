"""The model repository, pure: pinned manifest, its ConfigMap parts, revision hash, node cache, access."""
