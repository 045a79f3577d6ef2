"""Subcommands of the triton-operator CLI, one module each with register(subparsers)."""
