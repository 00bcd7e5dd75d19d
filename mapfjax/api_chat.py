"""One chat completion from an OpenAI-compatible endpoint with the project's retry policy,
shared by the API engineer and the API solver."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

# Endpoint settings left empty are read from these environment variables (the openai
# client's own names, plus one for the model).
ENV = {"base_url": "OPENAI_BASE_URL", "model": "OPENAI_MODEL", "api_key": "OPENAI_API_KEY"}


class ChatError(RuntimeError):
    """The request failed; `errors` lists every attempt, `retryable` says whether the last
    failure was transient (connection, timeout, HTTP 429 or 5xx) and retries ran out."""

    def __init__(self, errors: list[str], retryable: bool):
        super().__init__(f"API request failed after {len(errors)} attempt(s): {errors[-1]}")
        self.errors = errors
        self.retryable = retryable


def retryable(error: Exception) -> bool:
    """Connection errors and timeouts, HTTP 429 and 5xx are worth another attempt."""
    import openai  # optional (the `api` extra); only API calls need it

    if isinstance(error, openai.APIStatusError):
        return error.status_code >= 500 or error.status_code == 429
    return isinstance(error, openai.APIConnectionError)  # includes timeouts


def client(base_url: str, api_key: str, timeout: float):
    """An `openai.OpenAI` client (an empty base_url: the openai default). The client's own
    retries are off: `chat` retries."""
    import openai  # optional (the `api` extra); only API calls need it

    if not api_key:
        raise ValueError(f"no API key: pass one or set {ENV['api_key']}")
    return openai.OpenAI(base_url=base_url or None, api_key=api_key, max_retries=0, timeout=timeout)


def chat(
    api,
    model: str,
    prompt: str,
    *,
    temperature: float,
    max_tokens: int,
    max_retries: int = 3,
    backoff: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, list[str]]:
    """(reply text, errors of failed attempts). Transient failures are retried `max_retries`
    times after backoff * 2**attempt seconds; then, or on any other failure, ChatError."""
    errors: list[str] = []
    for attempt in range(max_retries + 1):
        try:
            reply = api.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                temperature=temperature,
                max_tokens=max_tokens,
            )
            return reply.choices[0].message.content or "", errors
        except Exception as e:  # every failure is recorded; only transient ones are retried
            errors.append(f"attempt {attempt}: {type(e).__name__}: {str(e)[:200]}")
            transient = retryable(e)
            if transient and attempt < max_retries:
                sleep(backoff * 2**attempt)
                continue
            raise ChatError(errors, transient) from e
    raise AssertionError("unreachable: the loop returns or raises on its last attempt")


@dataclasses.dataclass
class Endpoint:
    """Settings of an OpenAI-compatible chat endpoint, declared once for the API engineer and
    the API solver (both subclass it): base_url / model / api_key left empty fall back to the
    environment variables in `ENV`. Transient failures are retried `max_retries` times after
    backoff * 2**attempt seconds (see `chat`)."""

    model: str = ""
    base_url: str = ""
    api_key: str = ""
    max_retries: int = 3
    backoff: float = 1.0
    timeout: float = 120.0
    temperature: float = 0.7
    max_tokens: int = 4096
    sleep: Callable[[float], None] = time.sleep

    def settings(self) -> tuple[str, str, str]:
        """(base_url, model, api_key) after the environment fallbacks (`ENV`); empty when
        unset. The one place the environment is read."""
        return tuple(getattr(self, name) or os.environ.get(var, "") for name, var in ENV.items())

    def client(self):
        """An `openai.OpenAI` client for these settings."""
        base_url, _, key = self.settings()
        return client(base_url, key, self.timeout)

    def chat(self, api, prompt: str) -> tuple[str, list[str]]:
        """`chat` with these settings through the client `api`."""
        return chat(
            api,
            self.settings()[1],
            prompt,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            max_retries=self.max_retries,
            backoff=self.backoff,
            sleep=self.sleep,
        )
