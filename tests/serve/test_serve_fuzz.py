"""Fuzzing the server with schemathesis, from the server's own OpenAPI schema: a few hundred generated
requests per endpoint (fitting the schema, and for the POSTs breaking it too), each answered without a
500, with a status, content type and body that the schema documents (every check schemathesis has, as
its CLI's `--checks all`). The model field is set to the served model so that most requests reach the
engine (an unknown model is a 404 before anything else is read); a context of 64 tokens keeps every
generation short, so the run stays bounded in time."""
import pytest
from hypothesis import HealthCheck, given, settings

from minillm import AsyncLLM

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (the dev extra installs it)")
GenerationMode = schemathesis.GenerationMode


@pytest.fixture(scope="module")
def llm():
    return AsyncLLM("tiny", max_model_len=64)


OPERATIONS = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
              ("GET", "/v1/models/{model_id}"), ("GET", "/health"), ("GET", "/metrics")]


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.base_url + "/openapi.json")


def test_the_schema_documents_every_endpoint(api_schema):
    assert {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()} == set(OPERATIONS)


CASES = [(method, path, GenerationMode.POSITIVE) for method, path in OPERATIONS] + \
    [(method, path, GenerationMode.NEGATIVE) for method, path in OPERATIONS if method == "POST"]


def fuzz(api_schema, method: str, path: str, mode, checks: list) -> None:
    """Hypothesis drives schemathesis' strategy for the operation (its pytest loader is not used:
    it reads a pytest internal that pytest 9 removed). Positive requests fit the schema, negative
    ones break it (each must be a documented 4xx, never a 500)."""
    operation = api_schema[path][method]
    examples = 25 if method == "GET" else 250 if mode == GenerationMode.POSITIVE else 150

    @given(case=operation.as_strategy(mode))
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def answered_as_documented(case):
        if isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = "tiny"
        if case.path_parameters and "model_id" in case.path_parameters:
            case.path_parameters["model_id"] = "tiny"
        case.call_and_validate(checks=checks, timeout=60)

    answered_as_documented()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("method, path, mode", CASES)
def test_no_generated_request_gets_a_500_or_an_undocumented_answer(api_schema, method, path, mode):
    fuzz(api_schema, method, path, mode, [c for c in all_checks() if c.__name__ != "positive_data_acceptance"])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.xfail(reason="issue 50, left: JSON Schema calls 6.0 an integer, and the server refuses integral floats "
                   "where it takes an integer (top_logprobs 6.0, a token id 643.0); a fix accepts them as integers",
                   strict=False)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_every_request_that_fits_the_schema_is_accepted(api_schema, path):
    """schemathesis' positive_data_acceptance: a request the schema admits gets no 400."""
    fuzz(api_schema, "POST", path, GenerationMode.POSITIVE,
         [c for c in all_checks() if c.__name__ == "positive_data_acceptance"])


def all_checks() -> list:
    """Every check schemathesis has (its CLI's `--checks all`): no 500; the status, content type, headers and
    body as the schema documents them; data that breaks the schema refused, data that fits it accepted."""
    from schemathesis.checks import CHECKS, load_all_checks
    load_all_checks()
    return CHECKS.get_all()
