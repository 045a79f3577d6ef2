"""A Python client of a TritonService (or any tritonserver): models as attributes, every Triton API."""

from triton_operator.client.triton import ClientError, Model, TritonClient, UnknownModelError
from triton_operator.core.inputs import InputError

__all__ = ["ClientError", "InputError", "Model", "TritonClient", "UnknownModelError"]
