"""Secrets out of what people and files see: URL passwords and secret-named settings masked.

One helper for every place a text or a parameter set leaves the process that
holds it (error texts, status, dead letters, the dashboard, the CLI, checkpoint
metadata), so a Redis URL's password or a Kafka ``sasl.password`` is written
nowhere by accident.

>>> redact("cannot reach redis://:hunter2@127.0.0.1:6379/0")
'cannot reach redis://:***@127.0.0.1:6379/0'
>>> redact_params({"url": "redis://u:pw@h/0", "sasl.password": "pw", "stream": "cars"})
{'url': 'redis://u:***@h/0', 'sasl.password': '***', 'stream': 'cars'}
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

#: A setting whose name ends in one of these holds a secret (``sasl.password``, ``ssl.key.password``,
#: ``api_secret``, ``auth_token``): its value is masked whole.
SECRET_NAME = re.compile(r"(?:password|passwd|secret|token|api[_.-]?key)$", re.I)

# ``scheme://user:password@host``: the password is what lies between the first ':' after the
# user and the '@'.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s'\"]*:)(?P<secret>[^@/\s'\"]+)(?=@)", re.I)
# ``sasl.password='x'``, ``"sasl.password": "x"``, ``password=x`` inside a text (a repr, a message).
_NAMED_SECRET = re.compile(
    r"(?P<head>['\"]?[\w.-]*(?:password|passwd|secret|token|api[_.-]?key)['\"]?\s*[:=]\s*)"
    r"(?P<quote>['\"]?)(?P<secret>[^'\"\s,})&]+)", re.I)


def redact(text: str) -> str:
    """``text`` with every URL password and every ``<secret name>=value`` masked."""
    if not isinstance(text, str):
        text = str(text)
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    return _NAMED_SECRET.sub(lambda m: m["head"] + m["quote"] + MASK, text)


def redact_params(params: Any) -> Any:
    """A copy of ``params`` (mappings, lists, strings, nested) with secrets masked: the value of a
    secret-named key whole, URL passwords inside strings. Other values are returned as they are."""
    if isinstance(params, dict):
        return {k: MASK if isinstance(k, str) and SECRET_NAME.search(k) and v is not None
                else redact_params(v) for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return type(params)(redact_params(v) for v in params)
    if isinstance(params, str):
        return redact(params)
    return params
