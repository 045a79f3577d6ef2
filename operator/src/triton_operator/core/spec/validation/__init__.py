"""Checks of a TritonService spec beyond its schema: serverArgs, every model's config, ensembles."""
