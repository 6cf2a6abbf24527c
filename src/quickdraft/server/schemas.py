"""Request and response models of the OpenAI-compatible API.

These models are the server's contract: FastAPI validates requests against them and publishes
them as the OpenAPI schema (which schemathesis tests the server against), so every range a
parameter may take is stated here, not checked later by hand.

Defaults follow OpenAI's where they exist: ``temperature`` 1.0, ``top_p`` 1.0, ``n`` 1,
``max_tokens`` 16 for completions and "the rest of the context" for chat completions.
``temperature: 0`` is greedy decoding, the same as ``quickdraft generate``'s default (as in vLLM,
temperatures below 1e-5 decode greedily too).
Extensions (as in vLLM): ``top_k`` (0 or -1 = off) and ``gamma`` (draft length: an integer,
0 = plain decoding, or "auto", the CLI's default), ``sampling_rule`` (quickdraft/randomness.py).

``seed``: a seeded sampled request returns the same tokens every time it is sent, whatever its
``gamma``, the drafter's schedule and the other requests in flight (the coupled rule: identical to
seeded plain decoding with the same model flags), as long as the server's model, dtype, device and
exact mode are the same.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

OPENAI_MAX_STOP = 4
MAX_SEED = 2**63 - 1



def _integer(value: object) -> object:
    """JSON Schema's "integer" includes 1.0, so an integral float is an integer here too; strings and
    booleans are not (pydantic's lax mode would take "5" and True)."""
    if isinstance(value, (str, bytes, bool)):
        raise ValueError("Input should be a valid integer")
    return value


def Integer(**constraints: int) -> Any:
    """An integer as JSON Schema means it: 3 and 3.0, not "3", True or 3.5. (The constraints must come
    before the validator, or pydantic leaves them out of the JSON schema.)"""
    return Annotated[int, Field(**constraints), BeforeValidator(_integer)]


# Parameters accepted at their "off" value only, and the value to send instead.
UNSUPPORTED = {"logprobs": "null", "top_logprobs": "null", "best_of": "1"}

Penalty = Annotated[StrictFloat | StrictInt, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
# OpenAI's logit_bias: token ids (as JSON object keys, so strings) to a bias in [-100, 100].
LogitBias = dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")],
                 Annotated[StrictFloat | StrictInt, Field(ge=-100.0, le=100.0, allow_inf_nan=False)]]

Temperature = Annotated[StrictFloat, Field(ge=0.0, le=2.0, allow_inf_nan=False)]
TopP = Annotated[StrictFloat, Field(gt=0.0, le=1.0, allow_inf_nan=False)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """The parameters completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")  # like OpenAI-compatible servers: unknown fields are ignored

    model: StrictStr = Field(description="The served model's id (see GET /v1/models).")
    temperature: Temperature | None = Field(1.0, description="0 = greedy decoding. Default 1.0 (OpenAI's default).")
    top_p: TopP | None = Field(1.0, description="Nucleus sampling mass, in (0, 1].")
    top_k: Integer(ge=-1, le=1_000_000) | None = Field(
        None, description="Keep the k most likely tokens; 0 or -1 = off (extension)."
    )
    n: Integer(ge=1, le=1) | None = Field(1, description="Only n = 1 is supported.")
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=OPENAI_MAX_STOP)] | None = None
    seed: Integer(ge=0, le=MAX_SEED) | None = Field(
        None, description="With a seed, the same request returns the same tokens every time, whatever gamma and "
        "whatever else the server runs (the coupled sampling rule: identical to seeded plain decoding)."
    )
    gamma: Integer(ge=0, le=64) | Literal["auto"] | None = Field(
        None, description="Draft length per step: an integer (0 = plain decoding) or 'auto' (default)."
    )
    sampling_rule: Literal["auto", "coupled", "rejection"] | None = Field(
        None, description="How sampled drafts are verified: 'coupled' (a seed reproduces its text whatever gamma), "
        "'rejection' (min(1, p/q)), or 'auto' (default: coupled when a seed is given)."
    )
    # Applied to the target's logits only, so speculation stays lossless (quickdraft/logit_adjust.py).
    presence_penalty: Penalty | None = Field(
        None, description="Subtracted from the logit of every token generated so far (the prompt's are not counted)."
    )
    frequency_penalty: Penalty | None = Field(
        None, description="Subtracted from a token's logit once per time it was generated so far."
    )
    logit_bias: LogitBias | None = Field(
        None, description="Token id -> bias added to its logit, in [-100, 100] (-100 bans a token, 100 forces it)."
    )
    user: StrictStr | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    prompt: StrictStr | Annotated[list[Integer(ge=0)], Field(min_length=1)] = Field(
        description="A text prompt, or a prompt as token ids."
    )
    max_tokens: Integer(ge=1) | None = Field(16, description="Default 16 (OpenAI's default).")
    echo: StrictBool | None = False
    logprobs: None = Field(None, description="Not supported: only null is accepted.")
    best_of: Integer(ge=1, le=1) | None = Field(None, description="Only 1 is supported.")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Integer(ge=1) | None = Field(
        None, description="Default: the rest of the model's context."
    )
    max_completion_tokens: Integer(ge=1) | None = Field(
        None, description="OpenAI's newer name for max_tokens; takes precedence."
    )
    logprobs: Literal[False] | None = Field(None, description="Not supported: only false or null is accepted.")
    top_logprobs: Integer(ge=0, le=0) | None = Field(None, description="Not supported: only 0 or null is accepted.")


# ---- responses ------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpeculativeStats(BaseModel):
    """What speculative decoding did for this request (extension)."""

    drafter: str | None
    drafted: int = Field(description="Draft tokens proposed.")
    accepted: int = Field(description="Draft tokens the target accepted.")
    acceptance_rate: float = Field(description="accepted / drafted (0 when nothing was drafted).")
    mean_accepted_length: float = Field(description="Tokens committed per target forward (1.0 = plain decoding).")
    num_drafts: int = Field(description="Steps that verified at least one draft token.")
    target_calls: int
    accepted_per_position: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    speculative: SpeculativeStats


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculative: SpeculativeStats


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "quickdraft"
    context_length: int
    drafter: str | None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    queued: int
    running: int
    max_queue: int
    kernels: str | None = Field(None, description="the build of quickdraft's CPU kernels the engine's process "
                                "loaded (amx_bf16, avx512_bf16, avx2); null: torch's own products, 2-3x slower")
