"""schemathesis against the server's own OpenAPI schema: whatever a client sends, the server answers
as its schema says, and never with a 5xx.

CI runs a bounded number of examples per operation; a larger run:
    QUICKDRAFT_SCHEMA_EXAMPLES=500 pytest tests/test_server_schema.py
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from hf_factory import make_hf_checkpoint  # noqa: E402
from tokenizer_factory import write_char_tokenizer  # noqa: E402

from quickdraft import Engine  # noqa: E402
from quickdraft.server.app import create_app  # noqa: E402
from quickdraft.server.cli import BackgroundServer  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

MODEL = "tiny"
MAX_EXAMPLES = int(os.environ.get("QUICKDRAFT_SCHEMA_EXAMPLES", "25"))
VOCAB = 96  # the char tokenizer's
MAX_GENERATED = 8  # tokens: keeps each generation short, so the run fits its time budget


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path: Path = make_hf_checkpoint("llama", tmp_path_factory.mktemp("schema") / "target", seed=3)
    write_char_tokenizer(path)
    engine = Engine(str(path), drafter="prompt-lookup")
    app = create_app(engine, model_name=MODEL, max_body_bytes=256 * 1024)
    with BackgroundServer(app) as server:
        yield server


@pytest.fixture(scope="module")
def api_schema(served):
    schema = schemathesis.openapi.from_url(served.url + "/openapi.json")

    @schema.hook
    def map_body(context, body):
        """Most requests name the served model (else nearly all would stop at 404), and their token
        ids (prompts, biases) are in its vocabulary; generations are capped at a few tokens."""
        if not isinstance(body, dict):
            return body
        body = dict(body)
        if isinstance(body.get("model"), str) and len(body["model"]) % 7 != 3:
            body["model"] = MODEL
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and MAX_GENERATED < value < 10_000:
                body[key] = MAX_GENERATED
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) % 7 != 3 and all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 for t in prompt):
            body["prompt"] = [type(t)(int(t) % VOCAB) for t in prompt]  # most within the vocabulary
        bias = body.get("logit_bias")
        if isinstance(bias, dict) and len(bias) % 7 != 3 and all(isinstance(k, str) and k.isdigit() for k in bias):
            body["logit_bias"] = {str(int(k) % VOCAB): v for k, v in bias.items()}  # most within the vocabulary
        if "messages" in body and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = MAX_GENERATED  # chat's default is the rest of the context
        return body

    @schema.hook
    def map_path_parameters(context, path_parameters):
        if path_parameters and len(str(path_parameters.get("model", ""))) % 7 != 3:
            path_parameters = {**path_parameters, "model": MODEL}
        return path_parameters

    return schema


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_server_conforms_to_its_schema_and_never_answers_5xx(api_schema, mode):
    """Every operation, with data that fits the schema (positive) and data that does not (negative):
    no 5xx, and each response matches the schema (status code, content type, body)."""
    from schemathesis import GenerationMode

    from hypothesis.errors import Unsatisfiable

    failures: list[str] = []
    statuses: dict[str, Counter] = {}
    operations = [r.ok() for r in api_schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "GET /v1/models", "POST /v1/completions", "POST /v1/chat/completions", "GET /health", "GET /metrics"}
    for operation in operations:
        strategy = operation.as_strategy(generation_mode=GenerationMode(mode))

        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def check(case) -> None:
            response = case.call(timeout=60)
            statuses.setdefault(f"{case.method} {operation.path}", Counter())[response.status_code] += 1
            where = f"{case.method} {case.path} {str(case.body)[:300]!r} -> {response.status_code}"
            assert response.status_code < 500, f"{where}: {response.text[:300]}"
            # A request the schema allows may still be refused for what the schema cannot state (a prompt
            # longer than the context, token ids beyond the vocabulary, an unknown model): 4xx, not 2xx.
            case.validate_response(response, excluded_checks=[positive_data_acceptance])

        try:
            check()
        except Unsatisfiable:
            assert mode == "negative"  # an operation without parameters has no invalid input
        except AssertionError as exc:
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
    assert not failures, "\n".join(failures)
    print(mode, {op: dict(counts) for op, counts in statuses.items()})
    if mode == "positive":  # the run went past validation: requests were served, not only refused
        assert statuses["POST /v1/completions"][200] > 0
        assert statuses["POST /v1/chat/completions"][200] > 0
