"""The pod's model agent: the in-place files it reads, its state, Triton's model control, its status."""
