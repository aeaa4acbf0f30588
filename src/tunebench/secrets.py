"""Masking credentials in anything tunebench prints, logs or saves.

Store URLs carry passwords (``postgresql://user:password@host/db``), HTTP requests carry bearer
tokens. ``mask_secrets`` replaces them in free text with ``***``: the password of any URL's user
info, ``password=``/``token=``-style query parameters, and ``Bearer <token>``. ``tunebench.commands.main.main``
passes every message through it; code that builds a message or a record from a URL uses it too.
"""

from __future__ import annotations

import re

MASK = "***"

_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):(?P<secret>[^@\s]*)@")
_QUERY = re.compile(r"(?P<head>[?&;](?:password|passwd|pwd|token|secret|api_key|apikey|access_token)=)[^&;\s]*", re.I)
# the credential of "Bearer <credential>", up to a closing bracket or separator, which stays (the rest of the
# message is no part of the secret); not a word of a sentence about one ("it must hold the bearer token)")
_CREDENTIAL_END = r"[\s'\"()\[\]{}<>,;]"
_PROSE = r"(?:tokens?|credentials?|auth(?:entication|orization)?|header|scheme)"
_BEARER = re.compile(
    rf"(?P<head>\bBearer\s+)(?!{_PROSE}(?:{_CREDENTIAL_END}|[.:!?]?(?:\s|$)))[^\s'\"()\[\]{{}}<>,;]+", re.I
)


def mask_secrets(text: str) -> str:
    """text with URL passwords, secret query parameters and bearer tokens replaced by ***."""
    text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    text = _QUERY.sub(lambda m: f"{m['head']}{MASK}", text)
    return _BEARER.sub(lambda m: f"{m['head']}{MASK}", text)
