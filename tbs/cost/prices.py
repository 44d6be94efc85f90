"""Prices: parsing --cost, --spot and price files into USD per hour per device key.

A device without a price has no price (None), never 0, so it can never look free.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Mapping

from tbs.errors import TbsError

# a kind, one device, or one device of one host in a merged report: gpu, gpu:1, gpubox/gpu:1
_KEY = re.compile(r"^([\w.-]+/)?(cpu|gpu|tpu)(:\d+)?$")


def known_key(key: str) -> bool:
    """A device kind or name (gpu, gpu:1, host/gpu:1), or a device of the catalog tbs predicts for (h100)."""
    if _KEY.match(key):
        return True
    from tbs.predictions.catalog import load_catalog

    return key in load_catalog()


def parse_prices(text: str, where: str = "--cost") -> dict[str, float]:
    """Parse 'cpu=0.5,gpu=3' into {'cpu': 0.5, 'gpu': 3.0} (USD per hour).

    Keys are a device kind (cpu, gpu, tpu) or one device (gpu:1); values are
    hourly ('3', '3/h') or amortised hardware ('capex:25000/1y').
    """
    prices: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        value = value.strip()
        if not sep or not key or not value:
            raise TbsError(f"{where}: '{item}' is not KIND=USD_PER_HOUR; write e.g. cpu=0.5,gpu=3")
        if not known_key(key):
            raise TbsError(f"{where}: unknown device '{key}'; use cpu, gpu, tpu, one device such as gpu:0, "
                           f"or a catalog device such as h100 (tbs devices --catalog)")
        prices[key] = parse_price_value(value, key, where)
    if not prices:
        raise TbsError(f"{where}: no price given; write e.g. cpu=0.5,gpu=3")
    return prices


_CAPEX = re.compile(r"^capex:([^/]+)/(\d+(?:\.\d+)?)(y|m)$")
HOURS_PER_YEAR = 365 * 24


def parse_price_value(value: str, key: str = "device", where: str = "--cost") -> float:
    """USD per hour from '3', '3/h' or amortised hardware 'capex:25000/1y' (or '/18m').

    Capex is the thesis's method: price / (years x 365 x 24), so $25,000 over
    one year is $2.85/h. ``where`` starts each error: the option, or a price file and its line.
    """
    text = value.strip().lower()
    capex = _CAPEX.match(text)
    if capex:
        amount, span, unit = capex.groups()
        years = float(span) / (12.0 if unit == "m" else 1.0)
        try:
            usd = float(amount)
        except ValueError:
            usd = float("nan")
        if not math.isfinite(usd) or usd < 0 or years <= 0:
            raise TbsError(f"{where}: '{value}' for {key}: write capex:USD/YEARSy, e.g. {key}=capex:25000/1y")
        return usd / (years * HOURS_PER_YEAR)
    if text.startswith("capex"):
        raise TbsError(f"{where}: '{value}' for {key}: write capex:USD/YEARSy, e.g. {key}=capex:25000/1y")
    if text.endswith("/h"):
        text = text[:-2]
    try:
        usd_per_hour = float(text)
    except ValueError:
        raise TbsError(
            f"{where}: price '{value}' for {key} is not a number; write e.g. {key}=0.5 (USD per hour)"
        ) from None
    if not math.isfinite(usd_per_hour) or usd_per_hour < 0:
        raise TbsError(f"{where}: price {value} for {key} must be a finite number >= 0 (USD per hour)")
    return usd_per_hour


def parse_spot(text: str, where: str = "--spot") -> dict[str, float]:
    """'tpu=0.7,gpu:1=0.6' -> discount fractions (0.7 = 70% off the listed price)."""
    spot: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or not known_key(key):
            raise TbsError(f"{where}: '{item}' is not DEVICE=FRACTION; write e.g. tpu=0.7 (70% off)")
        spot[key] = _fraction(value, key, where)
    return spot


def _fraction(value: object, key: str, where: str) -> float:
    try:
        fraction = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        fraction = float("nan")
    if not 0.0 <= fraction < 1.0:
        raise TbsError(f"{where}: discount '{value}' for {key} must be a fraction in [0, 1), e.g. {key}=0.7")
    return fraction


def _mapping_key(key: object, where: str) -> str:
    name = str(key).strip().lower()
    if not isinstance(key, str) or not known_key(name):
        raise TbsError(f"{where}: unknown device {key!r}; use cpu, gpu, tpu, one device such as gpu:0, "
                       f"or a catalog device such as t4 (tbs devices --catalog)")
    return name


def prices_from_mapping(prices: Mapping[object, object], where: str = "prices") -> dict[str, float]:
    """{'cpu': 0.5, 'gpu': '3/h', 'tpu': 'capex:25000/1y'} checked key by key (Python callers)."""
    return {_mapping_key(k, where): parse_price_value(str(v), str(k), where) for k, v in prices.items()}


def spot_from_mapping(spot: Mapping[object, object], where: str = "spot") -> dict[str, float]:
    """{'tpu': 0.7} checked key by key: each a discount fraction in [0, 1)."""
    return {_mapping_key(k, where): _fraction(v, str(k), where) for k, v in spot.items()}


# one price-file entry: (where it is, e.g. "line 3" or "entry 'gpu'", its fields)
PriceEntry = tuple[str, dict[str, object]]


def _csv_entries(file: Path) -> list[PriceEntry]:
    """CSV rows with their file line (the header is line 1; a quoted newline counts as a line)."""
    import csv

    entries: list[PriceEntry] = []
    with open(file, newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            entries.append((f"line {reader.line_num}", dict(row)))
    return entries


def _yaml_key_lines(text: str) -> dict[str, int]:
    """The line of each top-level key, from the node tree (start marks are 0-based)."""
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode):
        return {}
    return {str(key.value): key.start_mark.line + 1 for key, _ in root.value}


def _yaml_entries(file: Path, path: str) -> list[PriceEntry]:
    """YAML device -> {price, source, date} (or -> a bare price), each with the line of its key."""
    import yaml

    text = file.read_text()
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise TbsError(f"--prices: '{path}' must map device names to prices")
    lines = _yaml_key_lines(text)
    entries: list[PriceEntry] = []
    for key, value in data.items():
        line = lines.get(str(key))
        where = f"line {line}" if line else f"entry '{key}'"
        entries.append((where, dict(value, device=key) if isinstance(value, dict) else {"device": key, "price": value}))
    return entries


def _read_price_entries(path: str) -> list[PriceEntry]:
    file = Path(path)
    if not file.is_file():
        raise TbsError(f"--prices: file '{path}' does not exist; give a CSV or YAML price list")
    suffix = file.suffix.lower()
    if suffix not in (".yaml", ".yml", ".csv"):
        raise TbsError(f"--prices: '{path}' must be .csv, .yaml or .yml")
    try:
        return _csv_entries(file) if suffix == ".csv" else _yaml_entries(file, path)
    except TbsError:
        raise
    except Exception as exc:
        raise TbsError(f"--prices: cannot read '{path}' ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None


def load_price_file(path: str) -> tuple[dict[str, float], dict[str, dict[str, str]]]:
    """Named prices from CSV or YAML: (USD per hour by device key, {key: source and date}).

    CSV columns: device, price (hourly or capex:USD/Ny), source, date.
    YAML: a mapping of device to {price, source, date} (or to a bare price).
    Errors name the file and the line, so the user can find the bad entry.
    """
    prices: dict[str, float] = {}
    sources: dict[str, dict[str, str]] = {}
    for where, entry in _read_price_entries(path):
        place = f"--prices {path} {where}"
        key = str(entry.get("device", "")).strip().lower()
        value = entry.get("price", entry.get("usd_per_hour"))
        if not known_key(key) or value is None:
            raise TbsError(f"{place}: each entry needs a device (cpu, gpu, tpu, gpu:0, or a catalog device such as "
                           f"t4) and a price; got {entry}")
        prices[key] = parse_price_value(str(value), key, where=place)
        sources[key] = {"price": str(value), "source": str(entry.get("source", "") or ""),
                        "date": str(entry.get("date", "") or "")}
    return prices, sources
