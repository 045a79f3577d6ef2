"""Python-backend test model of four input types: OUT = IMAGE * SCALE + OFFSET, TAG = LABEL upper-cased."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()  # FP32 [b, 2, 2]
            scale = pb_utils.get_input_tensor_by_name(request, "SCALE").as_numpy()  # INT32 [b, 1]
            offset = pb_utils.get_input_tensor_by_name(request, "OFFSET").as_numpy()  # UINT8 [b, 1]
            label = pb_utils.get_input_tensor_by_name(request, "LABEL").as_numpy()  # BYTES [b, 1]
            out = image * scale.reshape(-1, 1, 1) + offset.reshape(-1, 1, 1)
            tag = np.array([[bytes(x).upper() + b"!" for x in row] for row in label], dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", out.astype(np.float32)),
                        pb_utils.Tensor("TAG", tag),
                    ]
                )
            )
        return responses
