"""The plugin's settings: each one a command-line flag and an ini key; the flag wins.

A bad value is a ``pytest.UsageError`` that says where the value came from (the flag, an
``-o`` override, or the ini file and its section), so ``pytest`` stops before collecting.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from pytest_faultlab._messages import (
    BAD_DIRECTORY,
    BAD_INTEGER,
    BAD_PASS_RATE,
    BAD_REPEAT,
    MISSING_PATH,
    PASS_RATE_WITHOUT_REPEAT,
)

__all__ = ["OPTIONS", "Settings", "add_options", "read_settings"]

# ini key -> (flag, help)
OPTIONS = {
    "faultlab_report_dir": ("--faultlab-report-dir",
                            "where run folders go (default: <rootdir>/reports)"),
    "faultlab_golden_cache": ("--faultlab-golden-cache",
                              "golden-run cache, shared by xdist workers (default: "
                              "REPORT_DIR/.golden; on Slurm the shared runs root's)"),
    "faultlab_seed": ("--faultlab-seed", "override every experiment's seed"),
    "faultlab_repeat": ("--faultlab-repeat",
                        "run each experiment item N times, each run independent (the golden "
                        "run is shared); the item passes only if every run passes, unless "
                        "faultlab_min_pass_rate (default 1)"),
    "faultlab_min_pass_rate": ("--faultlab-min-pass-rate",
                               "with faultlab_repeat: the fraction of runs that must pass, a "
                               "fraction in (0, 1] such as 0.95, or a percentage (default: "
                               "every run)"),
    "faultlab_experiments": ("--faultlab-experiments",
                             "experiment files or folders to collect as test items (YAML "
                             "files given on the command line are always collected)"),
}


@dataclass(frozen=True, slots=True)
class Settings:
    report_dir: Path
    golden_cache: Path | None
    seed: int | None
    experiments: tuple[Path, ...]
    """Resolved paths whose YAML experiments are collected."""
    experiments_from_flag: bool
    repeat: int = 1
    """Runs per experiment item (``faultlab run --repeat``)."""
    min_pass_rate: Fraction = Fraction(1)
    """The fraction of an item's runs that must pass."""

    def covers(self, path: Path) -> bool:
        return any(path == p or p in path.parents for p in self.experiments)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("faultlab", "faultlab chaos experiments")
    for ini, (flag, help_) in OPTIONS.items():
        if ini == "faultlab_experiments":
            group.addoption(flag, dest=ini, action="extend", nargs="+", metavar="PATH",
                            default=None, help=help_)
            parser.addini(ini, help_, type="args", default=[])
        else:
            metavar = {"faultlab_seed": "N", "faultlab_repeat": "N",
                       "faultlab_min_pass_rate": "RATE"}.get(ini, "DIR")
            group.addoption(flag, dest=ini, default=None, metavar=metavar, help=help_)
            parser.addini(ini, help_, default=None)


def read_settings(config: pytest.Config) -> Settings:
    report = _path_setting(config, "faultlab_report_dir")
    golden = _path_setting(config, "faultlab_golden_cache")
    seed = _seed(config)
    paths, from_flag = _experiments(config)
    repeat = _repeat(config)
    return Settings(report_dir=report or config.rootpath / "reports", golden_cache=golden,
                    seed=seed, experiments=paths, experiments_from_flag=from_flag,
                    repeat=repeat, min_pass_rate=_min_pass_rate(config, repeat))


# --------------------------------------------------------------------------- internals


def _raw(config: pytest.Config, ini: str) -> tuple[Any, str, Path]:
    """``(value, where it came from, folder that relative paths are relative to)``; value is
    None when neither the flag nor the ini key is set."""
    flag = OPTIONS[ini][0]
    value = config.getoption(ini)
    if value is not None:
        return value, f"the command line ({flag})", config.invocation_params.dir
    value = config.getini(ini)
    if value is None or value == []:
        return None, "", config.rootpath
    base = config.inipath.parent if config.inipath else config.rootpath
    return value, _ini_source(config, ini), base


def _ini_source(config: pytest.Config, ini: str) -> str:
    entry = getattr(config, "_inicfg", {}).get(ini)  # pytest >= 9 tracks -o overrides here
    if getattr(entry, "origin", "file") == "override":
        return "-o/--override-ini"
    path = config.inipath
    if path is None:
        return "the ini file"
    if path.name == "pyproject.toml":
        section = "[tool.pytest]" if getattr(entry, "mode", "ini") == "toml" \
            else "[tool.pytest.ini_options]"
    elif path.name == "setup.cfg":
        section = "[tool:pytest]"
    else:
        section = "[pytest]"
    return f"{section} in {path.name}"


def _setting(ini: str, value: Any, source: str) -> str:
    """How the setting is named in a message: ``--faultlab-seed 'x'`` or ``faultlab_seed =
    'x'``."""
    if source.startswith("the command line"):
        return f"{OPTIONS[ini][0]} {value!r}"
    return f"{ini} = {value!r}"


def _seed(config: pytest.Config) -> int | None:
    value, source, _ = _raw(config, "faultlab_seed")
    if value is None:
        return None
    try:
        seed = value if isinstance(value, int) and not isinstance(value, bool) \
            else int(str(value).strip(), 10)
    except ValueError:
        seed = -1
    if not 0 <= seed < 2**63:
        raise pytest.UsageError(BAD_INTEGER.format(
            setting=_setting("faultlab_seed", value, source), source=source))
    return seed


def _repeat(config: pytest.Config) -> int:
    value, source, _ = _raw(config, "faultlab_repeat")
    if value is None:
        return 1
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(BAD_REPEAT.format(
            setting=_setting("faultlab_repeat", value, source), source=source))
    return int(text)


def _min_pass_rate(config: pytest.Config, repeat: int) -> Fraction:
    from faultlab.judge.repeats import ALL_PASS, parse_pass_rate

    ini = "faultlab_min_pass_rate"
    value, source, _ = _raw(config, ini)
    if value is None:
        return ALL_PASS
    try:
        rate = parse_pass_rate(str(value))
    except ValueError as e:
        raise pytest.UsageError(BAD_PASS_RATE.format(
            setting=_setting(ini, value, source), source=source, problem=e)) from None
    if repeat < 2:
        raise pytest.UsageError(PASS_RATE_WITHOUT_REPEAT.format(
            setting=_setting(ini, value, source), source=source))
    return rate


def _path_setting(config: pytest.Config, ini: str) -> Path | None:
    value, source, base = _raw(config, ini)
    if value is None:
        return None
    path = base / str(value)
    if path.exists() and not path.is_dir():
        raise pytest.UsageError(BAD_DIRECTORY.format(setting=_setting(ini, value, source),
                                                     source=source, path=path))
    return path


def _experiments(config: pytest.Config) -> tuple[tuple[Path, ...], bool]:
    ini = "faultlab_experiments"
    value, source, base = _raw(config, ini)
    if value is None:
        return (), False
    values = [value] if isinstance(value, str) else list(value)
    out = []
    for v in values:
        path = (base / str(v)).resolve()
        if not path.exists():
            raise pytest.UsageError(MISSING_PATH.format(setting=_setting(ini, v, source),
                                                        source=source, path=path))
        out.append(path)
    return tuple(dict.fromkeys(out)), source.startswith("the command line")
