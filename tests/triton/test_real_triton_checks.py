"""A real tritonserver refuses each model config the operator refuses for a check mirrored from Triton,
with that check's own words, and loads each config both accept.

The configs are tests/support/triton_rules.py's, rendered as the operator renders them, in one
repository served by one tritonserver (explicit model control, nothing loaded at start). Triton's
words come back in the load response, or, for checks it makes while reading the repository
("failed to poll from model repository"), only in its log, on the line naming the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from triton_rules import ACCEPTED, REFUSED, Case, write_repository
from tritonserver import RunningServer, TritonInstall, start_server

pytestmark = [pytest.mark.triton, pytest.mark.timeout(600)]

TIMEOUT = 120  # seconds a load may take before the test gives up (not an assertion on speed)

ON_CPU = [c for c in REFUSED if not c.not_on_cpu]


@pytest.fixture(scope="module")
def rules_server(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    base = tmp_path_factory.mktemp("triton-rules")
    repository = write_repository(ON_CPU + ACCEPTED, base / "models")
    server = start_server(triton_install, repository, [], base / "tritonserver.log")
    yield server
    server.stop()


def _load(server: RunningServer, model: str) -> tuple[int, str]:
    with requests.Session() as http:
        response = http.post(f"{server.http_url}/v2/repository/models/{model}/load", timeout=TIMEOUT)
    return response.status_code, response.text


@pytest.fixture(scope="module")
def verdicts(rules_server: RunningServer) -> dict[str, tuple[int, str]]:
    """Each case's model loaded (four at a time, as Triton loads them): the status, and Triton's
    words about it, from the response and the log lines naming the model."""
    models = [c.model for c in ON_CPU + ACCEPTED]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = dict(zip(models, pool.map(lambda m: _load(rules_server, m), models), strict=True))
    log = rules_server.log().splitlines()
    return {
        model: (status, "\n".join([text, *(line for line in log if f"'{model}'" in line)]))
        for model, (status, text) in answers.items()
    }


@pytest.mark.parametrize("case", ON_CPU, ids=[c.id for c in ON_CPU])
def test_triton_refuses_what_the_operator_refuses(verdicts: dict[str, tuple[int, str]], case: Case) -> None:
    status, said = verdicts[case.model]
    assert status != 200, said
    assert case.triton in said


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_triton_loads_what_the_operator_accepts(
    rules_server: RunningServer, verdicts: dict[str, tuple[int, str]], case: Case
) -> None:
    status, said = verdicts[case.model]
    assert status == 200, said
    with requests.Session() as http:
        ready = http.get(f"{rules_server.http_url}/v2/models/{case.model}/ready", timeout=TIMEOUT)
    assert ready.status_code == 200, ready.text


def test_cases_left_out_say_why() -> None:
    left_out = [c for c in REFUSED if c.not_on_cpu]
    assert all(len(c.not_on_cpu) > 20 for c in left_out)
    assert len(left_out) <= 1  # only model_metrics, which this tritonserver does not know
