"""How a finding's sentence places a measurement against the article's figure, in words computed from the
numbers (never typed): under, inside, over, or spanning the article's value or range."""

from __future__ import annotations


def against(low: float, high: float, band_low: float, band_high: float | None = None) -> str:
    """Where the interval (or range) `low`-`high` lies against the article's band `band_low`-`band_high` (or its
    single value `band_low`): "under", "over", "inside", "overlapping" or "spanning"."""
    band_high = band_low if band_high is None else band_high
    if high < band_low:
        return "under"
    if low > band_high:
        return "over"
    if band_low <= low and high <= band_high:
        return "inside"
    if low < band_low and high > band_high:
        return "spanning"
    return "overlapping"


def num(x: float, digits: int = 2) -> str:
    """`x` to `digits` significant decimals, without a trailing ".0" on a whole number of percent."""
    text = f"{x:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text and digits and float(text) == int(float(text)) else text
