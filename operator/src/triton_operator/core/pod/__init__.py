"""What a Triton pod runs, pure: the operator's policy over it, its start, its model agent's plan."""
