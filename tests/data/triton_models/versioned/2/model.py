"""Python-backend test model, version 2: OUTPUT = INPUT + 2 (a variable-length vector, no batching)."""

import numpy as np
import triton_python_backend_utils as pb_utils

VERSION = 2


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            out = pb_utils.Tensor("OUTPUT", (x + VERSION).astype(np.int64))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
