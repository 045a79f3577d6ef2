"""Python-backend model of tests/support/realrepo.py: reads and checks every weight shard at load, then
answers OUTPUT0 = INPUT0 + c, where c is derived from the shards' sha256 (so answers tell weights apart).

The load fails (Triton marks the model UNAVAILABLE and logs the message) when a shard is missing, has
another size than weights.json says, or another sha256.
"""

import hashlib
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

INDEX = "weights.json"
CHUNK = 8 * 1024 * 1024


def weights_constant(digests):
    """The number a model adds, from its shards' sha256 hex digests in index order: an integer in
    [1, 1000], exact in float32. realrepo.weights_constant is the same function."""
    combined = hashlib.sha256("\n".join(digests).encode()).digest()
    return float(int.from_bytes(combined[:4], "big") % 1000 + 1)


def check_shard(path, size, sha256, buffer):
    """Read one shard through ``buffer``; a ValueError names what does not match the index."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        raise ValueError(f"weights check failed: shard {name} is missing")
    actual = os.path.getsize(path)
    if actual != size:
        raise ValueError(f"weights check failed: shard {name} has {actual} bytes, weights.json says {size}")
    digest = hashlib.sha256()
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
    if digest.hexdigest() != sha256:
        raise ValueError(
            f"weights check failed: shard {name} has sha256 {digest.hexdigest()}, weights.json says {sha256}"
        )


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, INDEX)) as f:
            index = json.load(f)
        started = time.monotonic()
        buffer = bytearray(CHUNK)
        for shard in index["shards"]:
            check_shard(os.path.join(folder, shard["name"]), shard["size"], shard["sha256"], buffer)
        self.constant = np.float32(weights_constant([s["sha256"] for s in index["shards"]]))
        seconds = time.monotonic() - started
        total = sum(s["size"] for s in index["shards"])
        print(
            f"realrepo: {args['model_name']} version {args['model_version']}: checked "
            f"{len(index['shards'])} shards, {total} bytes in {seconds:.2f} s; c = {self.constant}",
            flush=True,
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + self.constant).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
