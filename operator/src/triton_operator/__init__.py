"""triton-operator: run NVIDIA Triton Inference Server on Kubernetes from one TritonService resource."""

__version__ = "0.1.0"

GROUP = "triton-operator.io"
VERSION = "v1alpha1"
KIND = "TritonService"
PLURAL = "tritonservices"
SINGULAR = "tritonservice"
SHORT_NAMES = ("tsvc", "triton")
FIELD_MANAGER = "triton-operator"
