"""Reading the parts of a request: the bearer token, the declared length and type of
the body, a strict JSON body, the query string. Pure functions: each refuses what it
cannot accept with the :class:`~xce_resize_plugin.errors.ResizeError` the answer names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.errors import InvalidRequest, UnsupportedMediaType
from xce_resize_plugin.rest.operation import Operation

_BEARER_RE = re.compile(r"\A[Bb][Ee][Aa][Rr][Ee][Rr] +(\S+) *\Z")
_JSON_TYPES = re.compile(r"\Aapplication/([a-z0-9.+-]+\+)?json\Z")


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    if not header:
        return None
    match = _BEARER_RE.match(header)
    return match.group(1) if match else None


def declared_length(header: str | None) -> int | None:
    """The body length a ``Content-Length`` header declares (``None``: not declared)."""
    if header is None:
        return None
    length = read_decimal(header.strip())
    if length is None:
        raise InvalidRequest(f"bad Content-Length {header!r}")
    return length


def check_json_type(header: str | None) -> None:
    """Refuse a body declared as anything but JSON (no declaration is accepted)."""
    if header is None:
        return
    media, _, params = header.partition(";")
    media = media.strip().lower()
    if not _JSON_TYPES.match(media):
        raise UnsupportedMediaType(f"got {media or 'an empty type'!r}")
    # JSON is UTF-8 (RFC 8259) and is read as such: a body declared in another charset
    # would be read as something its sender did not write.
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
            if charset not in ("utf-8", "utf8", "us-ascii", "ascii"):  # ASCII is UTF-8
                raise UnsupportedMediaType(f"got charset {charset!r}; JSON is UTF-8")


def check_query(query: Iterable[tuple[str, str]], op: Operation) -> dict[str, str]:
    """The query parameters of ``op``, refusing unknown or repeated ones."""
    params = op.query
    known = {p.name for p in params}
    out: dict[str, str] = {}
    for name, value in query:
        if name not in known:
            raise InvalidRequest(f"unknown query parameter {name!r}")
        if name in out:
            raise InvalidRequest(f"query parameter {name!r} given twice")
        out[name] = value
    for param in params:
        if param.required and param.name not in out:
            raise InvalidRequest(f"missing query parameter {param.name!r}")
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: The longest number a body may write (characters): every field's numbers are far
#: shorter (a version fits in 19 digits). A longer integer was refused with Python's
#: own advice ("Exceeds the limit (4300 digits)... use sys.set_int_max_str_digits()").
MAX_NUMBER = 100


def _long_number(text: str) -> InvalidRequest:
    return InvalidRequest(
        f"body has a number too long: {len(text)} characters, at most {MAX_NUMBER} ({text[:20]}...)"
    )


def _integer(text: str) -> int:
    if len(text) > MAX_NUMBER:
        raise _long_number(text)
    return int(text)


def _number(text: str) -> int | float:
    if len(text) > MAX_NUMBER:
        raise _long_number(text)
    # JSON has one number type: 2.0 and 2e0 are the integer 2, as JSON Schema (and so
    # the OpenAPI document) says. Decimal keeps that exact; the exponent bound keeps a
    # "1e999999" from becoming a huge int (it stays a float, which the fields refuse).
    try:
        value = Decimal(text)
        if value.adjusted() < 20 and value == value.to_integral_value():
            return int(value)
    except ArithmeticError:  # an exponent beyond Decimal's range (1e-99999999999999999999)
        raise ValueError(f"number {text[:40]!r} is out of range") from None
    return float(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A key given twice has no agreed meaning (RFC 8259: "unpredictable"): json keeps
    # the last, another reader of the same bytes the first. Refuse rather than guess.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidRequest(f"body gives the key {key[:40]!r} twice")
        out[key] = value
    return out


def parse_json(raw: bytes) -> Any:
    """Decode a UTF-8 JSON document strictly (no NaN/Infinity, no lone surrogates, no
    key given twice in an object)."""
    try:
        data = json.loads(
            raw.decode("utf-8"),
            parse_constant=_reject_constant,
            parse_float=_number,
            parse_int=_integer,
            object_pairs_hook=_unique_keys,
        )
        # A lone surrogate (\\ud800) decodes into a str no encoder accepts: refuse it
        # here rather than fail later on a notification command or a log line.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise InvalidRequest("body is nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"body is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except UnicodeEncodeError:
        raise InvalidRequest("body has a string with a lone surrogate (\\uD800-\\uDFFF)") from None
    except ValueError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    return data


def check_fields(data: Any, allowed: Iterable[str], what: str) -> None:
    """Refuse unknown top-level fields by their API names.

    The converters rename ``tasks``/``min_tasks`` to the model's ``max_add``/``min_add``
    before structuring, so a body that says ``max_add`` itself must be stopped here.
    """
    if isinstance(data, Mapping):
        known = set(allowed)
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            where = ", ".join(f"$.{k}" for k in unknown)
            raise InvalidRequest(f"{what}: unknown field(s) @ {where}")


__all__ = [
    "bearer_token",
    "check_fields",
    "check_json_type",
    "check_query",
    "declared_length",
    "parse_json",
]
