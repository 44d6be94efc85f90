"""Reading a profile's CSV files without trusting them: every value is checked before any stage sees it.

Two kinds of damage, told apart:

- **A last row cut short.** Rows are appended as cells finish; a full disk or a killed process
  can stop a write mid-row, leaving a last line with no line end. That row was never complete:
  it is left out with a warning, ``tbs profile --resume`` measures its cell again, and
  ``drop_cut_tail`` removes the fragment before anything is appended after it.
- **Any other bad value** (text where a number belongs, a negative or infinite time, an unknown
  status, a blank where a cell's name belongs, a measured status with no time) is a damaged
  row: refused with one line naming the file, the line and the value, never drawn or summed.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from tbs.errors import ProfileError, warn
from tbs.columns import COLUMN_KINDS, COLUMN_VALUES, COUNT, FLAG, REQUIRED_COLUMNS, SECONDS
from tbs.schema import USABLE

FIX = ("correct that line, or delete it and run tbs profile --resume to measure that cell again "
       "(or restore the file from a copy)")


def cut_tail_offset(path: Path) -> int | None:
    """Where a cut last row starts (the byte after the last line end), or None when the file ends a line."""
    size = path.stat().st_size
    if size == 0:
        return None
    with open(path, "rb") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return None
        # Scan back for the last line end, a block at a time (the file may be large).
        position = size
        while position > 0:
            start = max(0, position - 65536)
            handle.seek(start)
            block = handle.read(position - start)
            found = block.rfind(b"\n")
            if found >= 0:
                return start + found + 1
            position = start
    return 0


def drop_cut_tail(path: Path) -> bool:
    """Remove a cut last row's bytes so the next append starts a line; True if there was one."""
    if not path.is_file():
        return False
    offset = cut_tail_offset(path)
    if offset is None:
        return False
    os.truncate(path, offset)
    return True


def read_table(path: Path, name: str, columns: list[str]) -> pd.DataFrame:
    """The file's rows, checked against the schema; missing columns added blank."""
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=columns)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"cannot read '{path}' ({exc.strerror}); check its permissions") from None
    if not data.endswith(b"\n"):
        end = data.rfind(b"\n") + 1
        line = data[:end].count(b"\n") + 1
        warn(f"'{path}' line {line} was cut short (a write was interrupted: a full disk or a killed run); "
             f"it is left out, and tbs profile --resume measures its cell again")
        data = data[:end]
        if not data:
            return pd.DataFrame(columns=columns)
    try:
        text = data.decode("utf-8")
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=True)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProfileError(f"'{path}' is damaged ({reason}); correct the line it names, or restore the file "
                           f"from a copy") from None
    frame = _checked(frame, name, path, text)
    for column in columns:
        if column not in frame.columns:
            frame[column] = None
    return frame


def _checked(frame: pd.DataFrame, name: str, path: Path, text: str) -> pd.DataFrame:
    """Each column converted to its kind; the first bad value found is one ProfileError with its line."""
    problems: list[tuple[int, str]] = []  # (row index, what is wrong)
    for column in REQUIRED_COLUMNS.get(name, ()):
        if column in frame.columns:
            problems += [(i, f"{column} is blank") for i in np.flatnonzero(frame[column].isna().to_numpy())]
        elif len(frame):
            raise ProfileError(f"'{path}' has no {column} column: it is not a tbs {name}.csv; restore it from a copy")
    for column in frame.columns:
        kind = COLUMN_KINDS.get(column)
        if kind == FLAG:
            frame[column], bad = _flags(frame[column])
            problems += bad
        elif kind is not None:
            frame[column], bad = _numbers(frame[column], kind)
            problems += [(i, why) for i, why in bad]
        elif column in COLUMN_VALUES:
            values = frame[column]
            wrong = values.notna() & ~values.isin(COLUMN_VALUES[column])
            problems += [(i, f"{column} '{values.iloc[i]}' is not one of {', '.join(COLUMN_VALUES[column])}")
                         for i in np.flatnonzero(wrong.to_numpy())]
    if "status" in frame.columns and "median_s" in frame.columns:
        untimed = frame["status"].isin(USABLE) & frame["median_s"].isna()
        problems += [(i, f"status {frame['status'].iloc[i]} but median_s is blank")
                     for i in np.flatnonzero(untimed.to_numpy())]
    if problems:
        first = min(index for index, _ in problems)
        why = "; ".join(dict.fromkeys(why for index, why in problems if index == first))
        raise ProfileError(f"'{path}' line {_line_of(text, first)}: {why}; {FIX}")
    return frame


def _flags(values: pd.Series) -> tuple[pd.Series, list[tuple[int, str]]]:
    """A column of True/False (blank where it does not apply), and the rows holding anything else."""
    known = {"True": True, "False": False, "true": True, "false": False}
    wrong = values.notna() & ~values.isin(list(known))
    bad = [(i, f"{values.name} '{values.iloc[i]}' is not True or False") for i in np.flatnonzero(wrong.to_numpy())]
    return values.map(lambda v: known.get(v) if isinstance(v, str) else None).astype(object), bad


def _numbers(values: pd.Series, kind: str) -> tuple[pd.Series, list[tuple[int, str]]]:
    """A column as numbers of ``kind``, and the rows whose value is not one."""
    column = values.name
    numbers = pd.to_numeric(values, errors="coerce")
    present = values.notna().to_numpy()
    raw = numbers.to_numpy(dtype=float)
    bad: list[tuple[int, str]] = []
    for i in np.flatnonzero(present & np.isnan(raw)):
        bad.append((i, f"{column} '{values.iloc[i]}' is not a number"))
    finite = np.isfinite(raw)
    for i in np.flatnonzero(present & ~np.isnan(raw) & ~finite):
        bad.append((i, f"{column} {values.iloc[i]} is not a finite number"))
    for i in np.flatnonzero(finite & (raw < 0)):
        what = "a time" if kind == SECONDS else "a count" if kind == COUNT else "this amount"
        bad.append((i, f"{column} {values.iloc[i]} is below 0, impossible for {what}"))
    if kind == COUNT:
        for i in np.flatnonzero(finite & (raw >= 0) & (np.mod(raw, 1) != 0)):
            bad.append((i, f"{column} {values.iloc[i]} is not a whole number"))
    # Whole numbers written as such stay integers (as pandas would read them); the rest are floats.
    if len(values) and not bad and values.notna().all() and values.str.fullmatch(r"[+-]?\d+").all():
        return numbers.astype("int64"), bad
    return numbers.astype(float), bad


def _line_of(text: str, index: int) -> int:
    """The file line where data row ``index`` starts (quoted fields may span lines)."""
    reader = csv.reader(io.StringIO(text))
    line, record = 1, 0
    for row in reader:
        if row:  # pandas skips blank lines: so do the record numbers
            if record == index + 1:
                return line
            record += 1
        line = reader.line_num + 1
    return line
