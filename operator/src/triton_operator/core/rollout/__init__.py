"""The rollout engine, one concept a module (how it works: docs/rollouts.md, "How the engine works")."""
