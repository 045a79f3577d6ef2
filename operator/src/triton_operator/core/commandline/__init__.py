"""The command lines' pure helpers: shell completion, machine-readable output, a request's inputs."""
