"""The operator process imports no client or cloud SDK it never uses (start-up memory, issue 26)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# What `triton-operator run` imports before kopf starts: the command, kopf, the handlers, /metrics.
OPERATOR_IMPORTS = (
    "import sys, json\n"
    "import kopf\n"
    "import triton_operator.commands.run, triton_operator.handlers, triton_operator.metrics\n"
    "print(json.dumps(sorted(sys.modules)))\n"
)
# tritonclient.grpc's package init imports grpc, numpy and the gRPC client (~38 MiB); the stores'
# SDKs load only when a store of theirs is read.
HEAVY = (
    "grpc",
    "tritonclient.grpc",
    "tritonclient.utils",
    "numpy",
    "boto3",
    "botocore",
    "google.cloud",
    "azure",
)


def run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    return done.stdout


def operator_modules() -> list[str]:
    modules: list[str] = json.loads(run_python(OPERATOR_IMPORTS))
    return modules


def test_the_operator_process_imports_no_grpc_numpy_or_cloud_sdk() -> None:
    modules = operator_modules()
    assert "triton_operator.core.spec.modelconfig" in modules
    assert "tritonclient.grpc.model_config_pb2" in modules  # the one file, loaded on its own
    loaded = [
        m
        for m in modules
        if any(m == h or m.startswith(h + ".") for h in HEAVY) and m != "tritonclient.grpc.model_config_pb2"
    ]
    assert loaded == []


def test_the_client_loaded_after_the_operator_shares_its_model_config_module() -> None:
    code = (
        "from triton_operator.core.spec import modelconfig\n"
        "import tritonclient.grpc\n"
        "print(tritonclient.grpc.model_config_pb2 is modelconfig.model_config_pb2,"
        " tritonclient.grpc.model_config_pb2.ModelConfig is modelconfig.ModelConfig)\n"
    )
    assert run_python(code).split() == ["True", "True"]
