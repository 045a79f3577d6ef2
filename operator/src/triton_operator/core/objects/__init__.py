"""The Kubernetes objects a TritonService owns, as dicts: ConfigMaps, Deployment, Services, names."""
