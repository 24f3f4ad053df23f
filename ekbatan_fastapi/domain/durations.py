"""ISO-8601 durations (``PT10S``, ``PT0.2S``, ``P14D``) for settings and schedules.

Settings accept ISO-8601 only, like db-scheduler's ``Duration.parse``. Shorthands such as
``10s`` are rejected with an error that shows the ISO form to write instead, so a typo
fails at startup rather than silently meaning something else.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

from .errors import ScheduleError

__all__ = ["format_iso_duration", "parse_iso_duration"]

_ISO = re.compile(
    r"""
    P
    (?:(?P<weeks>\d+)W)?
    (?:(?P<days>\d+)D)?
    (?:T(?=\d)
        (?:(?P<hours>\d+)H)?
        (?:(?P<minutes>\d+)M)?
        (?:(?P<seconds>\d+(?:[.,]\d+)?)S)?
    )?
    """,
    re.IGNORECASE | re.VERBOSE | re.ASCII,
)
# Years and months (``P1Y``, ``P2M``, ``P1Y2M3D``): valid ISO, but of no fixed length.
_CALENDAR = re.compile(
    r"P(?P<years>\d+Y)?(?P<months>\d+M)?(?:\d+W)?(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:[\d.,]+S)?)?",
    re.IGNORECASE | re.ASCII,
)
_SHORTHAND = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h|d)", re.I | re.A)
_UNIT_SECONDS = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
_MAX_DIGITS = 30  # larger numbers cannot fit a timedelta anyway
_EXAMPLES = "PT10S, PT0.2S, PT5M, PT1H30M or P1D"


def _where(setting: str | None) -> str:
    return f" for {setting}" if setting else ""


def _from_seconds(seconds: Decimal) -> timedelta:
    """Exact Decimal seconds to timedelta; raises ValueError/OverflowError when impossible."""
    micros = seconds * 1_000_000
    if micros != micros.to_integral_value():
        raise ValueError("finer than a microsecond")
    return timedelta(microseconds=int(micros))


def _shorthand_hint(text: str) -> str | None:
    """The ISO form of a shorthand such as ``10s``/``200ms``/``5m``, or None."""
    match = _SHORTHAND.fullmatch(text)
    if match is None or len(match["number"]) > _MAX_DIGITS:
        return None
    try:
        seconds = Decimal(match["number"]) * _UNIT_SECONDS[match["unit"].lower()]
        return format_iso_duration(_from_seconds(seconds))
    except (ValueError, OverflowError, ArithmeticError):
        return None


def parse_iso_duration(text: str, *, setting: str | None = None) -> timedelta:
    """Parse a non-negative ISO-8601 duration (``PT10S``, ``P1DT2H``, case-insensitive).

    ``setting`` names the setting being parsed, so that the error message can point at it.
    Raises ScheduleError for anything else (shorthands, negatives, years and months).
    """
    where = _where(setting)
    return _amount(text, _iso_parts(text, where), where)


def _iso_parts(text: object, where: str) -> dict[str, str | None]:
    """The fields of ``text`` read as an ISO-8601 duration: the form only (a string, not
    negative, the designators in order), not the size of the numbers."""
    if not isinstance(text, str):
        raise ScheduleError(
            f"{text!r} is not an ISO-8601 duration{where}; expected a string like {_EXAMPLES}"
        )
    stripped = text.strip()
    if stripped.startswith("-") or (stripped[:1].upper() == "P" and "-" in stripped):
        raise ScheduleError(
            f"{text!r} is a negative duration{where}; durations must be zero or positive"
        )
    match = _ISO.fullmatch(stripped)
    if match is None or not any(match.groupdict().values()):
        raise ScheduleError(_rejection(text, stripped, where))
    return match.groupdict()


def _amount(text: str, parts: dict[str, str | None], where: str) -> timedelta:
    """The duration the fields add up to: at most microseconds, within ``timedelta``."""
    whole, _, fraction = (parts["seconds"] or "0").replace(",", ".").partition(".")
    fraction = fraction.rstrip("0")
    if len(fraction) > 6:
        raise ScheduleError(
            f"{text!r} is finer than a microsecond{where}; use at most 6 decimals of seconds"
        )
    numbers = [whole, parts["minutes"], parts["hours"], parts["days"], parts["weeks"]]
    if any(number is not None and len(number) > _MAX_DIGITS for number in numbers):
        raise ScheduleError(f"{text!r} is too large a duration{where}")
    seconds = int(whole) + 60 * int(parts["minutes"] or 0) + 3600 * int(parts["hours"] or 0)
    seconds += 86400 * (int(parts["days"] or 0) + 7 * int(parts["weeks"] or 0))
    try:
        return timedelta(seconds=seconds, microseconds=int(fraction.ljust(6, "0")))
    except OverflowError:
        raise ScheduleError(f"{text!r} is too large a duration{where}") from None


def _rejection(text: str, stripped: str, where: str) -> str:
    """The most helpful message for a string that is not an ISO-8601 duration."""
    hint = _shorthand_hint(stripped)
    if hint is not None:
        return f"{text!r} is not an ISO-8601 duration{where}; write {hint}"
    if re.fullmatch(rf"[0-9]{{1,{_MAX_DIGITS}}}", stripped):
        return (
            f"{text!r} is not an ISO-8601 duration{where}; it has no unit "
            f"(write PT{int(stripped)}S for {int(stripped)} seconds)"
        )
    calendar = _CALENDAR.fullmatch(stripped)
    if calendar is not None and (calendar["years"] or calendar["months"]):
        return (
            f"{text!r} uses years or months{where}, whose length is ambiguous; "
            "write days instead, e.g. P30D or P365D"
        )
    return f"{text!r} is not an ISO-8601 duration{where}; expected a form like {_EXAMPLES}"


def format_iso_duration(duration: timedelta) -> str:
    """Canonical ISO-8601 form of ``duration`` (``PT10S``, ``PT0.2S``, ``P1DT2H``) for display.

    Days stay days (never weeks); a negative duration gets a leading ``-``.
    """
    if duration < timedelta(0):
        return "-" + format_iso_duration(-duration)
    days, seconds, micros = duration.days, duration.seconds, duration.microseconds
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    date_part = f"P{days}D" if days else "P"
    time_part = ""
    if hours:
        time_part += f"{hours}H"
    if minutes:
        time_part += f"{minutes}M"
    if secs or micros:
        fraction = f".{micros:06d}".rstrip("0") if micros else ""
        time_part += f"{secs}{fraction}S"
    if not days and not time_part:
        return "PT0S"
    return date_part + (f"T{time_part}" if time_part else "")
