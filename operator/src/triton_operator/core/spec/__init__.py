"""The TritonService spec, pure: its checks, Triton's ModelConfig, and the CRD schema derived from them."""
