"""Decoupled Python-backend test model: COUNT responses to one request, the i-th OUT = VALUE * i."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            sender = request.get_response_sender()
            for i in range(1, count + 1):
                out = pb_utils.Tensor("OUT", (value * i).astype(np.float32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
