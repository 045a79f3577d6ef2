"""Pure core: TritonService spec in, desired objects, config.pbtxt and rollout decisions out; no I/O."""
