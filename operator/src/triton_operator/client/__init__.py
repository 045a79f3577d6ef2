"""A Python client of a TritonService (or any tritonserver): models as attributes, every Triton API."""

from triton_operator.client.triton import (
    ClientError,
    Model,
    ModelNotServedError,
    TritonClient,
    UnknownModelError,
)
from triton_operator.client.tuning_runner import tune
from triton_operator.core.commandline.inputs import InputError
from triton_operator.core.tuning import Sweep, TuningError

__all__ = [
    "ClientError",
    "InputError",
    "Model",
    "ModelNotServedError",
    "Sweep",
    "TritonClient",
    "TuningError",
    "UnknownModelError",
    "tune",
]
