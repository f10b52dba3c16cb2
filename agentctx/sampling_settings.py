"""The sampling settings a user can choose, and their one set of checks: config.json's
"sampling" (defaults for every answer), a session's `/set` (stored with the session) and
`ask`'s flags. Layered, later wins: built-in defaults, config.json, the session's settings,
flags given on the command line.

Settings are plain dicts of field -> value, e.g. {"temperature": 0.7, "max_steps": 3}; a
value of None for "seed" means a fresh random seed per answer."""

from __future__ import annotations

import dataclasses
import math

from agentctx.agent import DEFAULT_MAX_STEPS

# field -> (type, check, what the check wants)
FIELDS = {
    "temperature": (float, lambda v: v >= 0, ">= 0"),
    "top_p": (float, lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (int, lambda v: v >= 0, ">= 0 (0: off)"),
    "max_tokens": (int, lambda v: v >= 1, ">= 1"),
    "repetition_penalty": (float, lambda v: v > 0, "> 0"),
    "seed": (int, lambda v: True, "a whole number, or none"),
    "max_steps": (int, lambda v: v >= 0, ">= 0"),
}
_TYPES = {float: "a number", int: "a whole number"}
# the names /set also takes (and shows)
ALIASES = {"repeat_penalty": "repetition_penalty", "steps": "max_steps"}
# what agentctx answers with when nothing is set (a light repetition penalty: the small
# models loop without it)
DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 400,
            "repetition_penalty": 1.1, "seed": None, "max_steps": DEFAULT_MAX_STEPS}  # fmt: skip


def field_of(name: str) -> str:
    """The field a name (`repeat-penalty`, `steps`, `top_p`) means; ValueError if none."""
    key = name.replace("-", "_")
    field = ALIASES.get(key, key)
    if field not in FIELDS:
        raise ValueError(f"unknown option {name}; options: {', '.join(FIELDS)}")
    return field


def check_value(field: str, value):
    """The value, if it is one `field` takes; ValueError saying what it takes if not."""
    kind, ok, wanted = FIELDS[field]
    if field == "seed" and value is None:
        return None
    # (JSON's true is an int to Python; a float field takes a whole number too)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not numeric or kind is int and not isinstance(value, int):
        raise ValueError(f"{field} must be {_TYPES[kind]}, not {value!r}")
    value = kind(value)
    if kind is float and not math.isfinite(value) or not ok(value):
        raise ValueError(f"{field} must be {wanted}, not {value!r}")
    return value


def parse(name: str, text: str) -> tuple[str, object]:
    """A setting typed as text (`/set temperature 0.7`, `/set seed none`): (field, value)."""
    field = field_of(name)
    text = text.strip()
    if field == "seed" and text.lower() in ("none", "off"):
        return field, None
    return field, check_value(field, FIELDS[field][0](text))  # ("could not convert ...")


def checked(settings, where: str) -> dict:
    """A settings dict read from a file or the store, checked; ValueError naming `where`."""
    if not isinstance(settings, dict):
        raise ValueError(f"{where} must be an object of settings ({', '.join(FIELDS)})")
    out = {}
    for name, value in settings.items():
        try:
            field = field_of(str(name))
            out[field] = check_value(field, value)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return out


def stored(session) -> dict:
    """A session's stored /set settings (None: a new session); any not valid are left out."""
    try:
        return checked(getattr(session, "settings", None) or {}, "stored settings")
    except ValueError:
        return {}


def config_settings(config: dict | None = None) -> dict:
    """config.json's "sampling" (checked when the config is loaded)."""
    from agentctx.models import load_config

    config = load_config() if config is None else config
    return dict(config.get("sampling") or {})


def resolve(*layers: dict | None):
    """(SamplingParams, max_steps) of the built-in defaults with each layer on top."""
    from engine import SamplingParams

    merged = in_effect(*layers)
    max_steps = merged.pop("max_steps")
    return SamplingParams(**merged), max_steps


def apply(params, max_steps: int, settings: dict | None):
    """`params` and `max_steps` with `settings` on top."""
    settings = dict(settings or {})
    max_steps = settings.pop("max_steps", max_steps)
    return dataclasses.replace(params, **settings), max_steps


def in_effect(*layers: dict | None) -> dict:
    """Every field's value with each layer on top of the built-in defaults."""
    merged = dict(DEFAULTS)
    for layer in layers:
        merged.update(layer or {})
    return merged


def describe(params, max_steps: int) -> str:
    """One line: every setting by the name /set takes."""
    values = {f: getattr(params, f) for f in FIELDS if f != "max_steps"}
    return describe_values({**values, "max_steps": max_steps})


def describe_values(values: dict) -> str:
    shown = {v: k for k, v in ALIASES.items()}
    return " · ".join(f"{shown.get(f, f)} {values[f]}" for f in FIELDS)
