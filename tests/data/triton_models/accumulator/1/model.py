"""Python-backend test model for sequence batching: OUTPUT is the running sum of INPUT per sequence id."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy().reshape(-1)
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)
            totals = np.zeros_like(value)
            for row in range(value.shape[0]):
                key = int(corrid[row])
                if start[row]:
                    self.sums[key] = np.zeros_like(value[row])
                if key not in self.sums:
                    responses.append(
                        pb_utils.InferenceResponse(
                            error=pb_utils.TritonError(f"sequence {key} was not started")
                        )
                    )
                    break
                self.sums[key] = self.sums[key] + value[row]
                totals[row] = self.sums[key]
                if end[row]:
                    del self.sums[key]
            else:
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", totals)])
                )
        return responses
