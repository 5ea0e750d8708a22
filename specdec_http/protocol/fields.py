"""The field types OpenAI's JSON uses, as this server reads them.

JSON numbers are strict: an integer field takes an integer (or an integral float such as
9.0, which some clients send), never a string or a bool; a number field takes any finite
number. `neutral_only` marks a field this server does not implement: it accepts the value
a client sends by default (e.g. `repetition_penalty: 1.0`), which changes nothing, and refuses
any other, since ignoring it would change the output the client expects.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

MIN_SEED = -(2**63)  # OpenAI's seeds are int64; negative ones map to their two's complement in uint64
MAX_SEED = 2**64 - 1  # the core's seeds are uint64


def _integral(value: Any) -> Any:
    """9.0 -> 9 (an integral float is an integer in JSON); anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, Field(strict=True), BeforeValidator(_integral)]
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Bool = Annotated[bool, Field(strict=True)]
TokenIds = list[Annotated[int, Field(strict=True)]]


def _is_neutral(value: Any, neutrals: tuple[Any, ...]) -> bool:
    """Equal to one of `neutrals`, a bool only to a bool (`best_of: true` is not 1)."""
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutrals)


def neutral_only(schema: dict[str, Any], *neutrals: Any, why: str = "is not supported by this server") -> Any:
    """A field accepted only at one of `neutrals` (None = left out is always one); its JSON
    schema is `schema` (OpenAI's type of the field)."""

    def check(value: Any) -> Any:
        if not _is_neutral(value, (None, *neutrals)):
            raise ValueError(f"{why} (got {value!r:.100})")
        return value

    described = {**schema, "description": f"accepted only at its neutral value ({', '.join(map(repr, neutrals))})"}
    return Annotated[Any, AfterValidator(check), WithJsonSchema(described)]


def ignored(schema: dict[str, Any]) -> Any:
    """An OpenAI field that changes nothing this server returns: accepted and ignored (logged)."""
    return Annotated[Any, WithJsonSchema({**schema, "description": "accepted and ignored (changes nothing here)"})]
