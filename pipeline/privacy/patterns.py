"""The checks on a privacy setting, done before any work: the enabled types and the user's
``[privacy.patterns] NAME = "regex"`` table.

Each refusal is a :class:`~docintel.pipeline.errors.ConfigError` (exit code 2) that names
the type or the pattern: a type name that is not built in, a pattern name that is not an
upper-case identifier or that is a built-in type's name, a regex that does not compile, and
a regex that can match the empty string (it would insert placeholders between characters).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping

from docintel.pipeline.errors import ConfigError
from docintel.pipeline.privacy.detectors import BUILTIN_TYPES

NAME = re.compile(r"[A-Z][A-Z0-9_]*")
WHERE = "[privacy.patterns]"


def check_types(types: Iterable[str] | None) -> tuple[str, ...]:
    """The enabled built-in types in priority order (each once); ``None``: all of them."""
    if types is None:
        return BUILTIN_TYPES
    if isinstance(types, str):
        types = [types]
    chosen = set()
    for name in types:
        if name not in BUILTIN_TYPES:
            raise ConfigError(
                f"[privacy] types: unknown type {name!r}; the built-in types are "
                f"{', '.join(BUILTIN_TYPES)} (add your own under {WHERE})"
            )
        chosen.add(name)
    return tuple(t for t in BUILTIN_TYPES if t in chosen)


def _min_width(regex: re.Pattern[str]) -> int:
    """The fewest characters ``regex`` can match, from the parsed pattern (exact); where this
    Python's parser is not reachable, 0 when an empty string or a probe yields an empty
    match, else 1."""
    parser = getattr(re, "_parser", None)  # CPython 3.11+: the compiler's own parser
    if parser is not None:
        with contextlib.suppress(Exception):  # a change of that private API: the probes
            return int(parser.parse(regex.pattern, regex.flags).getwidth()[0])
    if regex.fullmatch(""):
        return 0
    probe = "Ab 1-2.x@y, (Z) _\n"
    return 0 if any(m.start() == m.end() for m in regex.finditer(probe)) else 1


def _compile_one(name: object, pattern: object) -> re.Pattern[str]:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(
            f"{WHERE} {name!r}: a pattern's name must be an upper-case identifier "
            "(A-Z, 0-9, _; first a letter), such as CUSTOMER_ID: it becomes the placeholder "
            "<NAME>"
        )
    if name in BUILTIN_TYPES:
        raise ConfigError(f"{WHERE} {name}: this is a built-in type's name; choose another")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{WHERE} {name}: the pattern must be a non-empty string")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{WHERE} {name}: invalid regular expression: {exc}") from None
    if _min_width(regex) == 0:
        raise ConfigError(
            f"{WHERE} {name}: the regular expression can match the empty string "
            f"(e.g. a `*` or `?` on every part, or only anchors); require at least one character"
        )
    return regex


def compile_patterns(patterns: Mapping[str, str] | None) -> dict[str, re.Pattern[str]]:
    """``{NAME: regex}`` -> ``{NAME: compiled}``, in the order given (their priority among
    themselves); refused with :class:`ConfigError` naming the first bad entry."""
    if patterns is None:
        return {}
    if not isinstance(patterns, Mapping):
        raise ConfigError(f'{WHERE} must be a table of NAME = "regex"')
    return {name: _compile_one(name, pattern) for name, pattern in patterns.items()}
