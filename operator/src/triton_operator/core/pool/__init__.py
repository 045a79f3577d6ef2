"""The model pool (spec.pool), pure: models placed on pods, their copies, the labels that route by model."""
