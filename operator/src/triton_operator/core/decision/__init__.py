"""One pass's decision, pure: what it observed in; the rollout plan, writes, status and scales out."""
