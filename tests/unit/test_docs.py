"""The trainer's README explains every flag the trainer and faultlab's launcher accept."""

from __future__ import annotations

import re
from pathlib import Path

import reference_trainer
from faultlab.targets.launcher import launch_parser
from reference_trainer.config import add_train_args

README = Path(reference_trainer.__file__).with_name("README.md").read_text()


def test_every_flag_is_documented() -> None:
    parser = launch_parser()
    add_train_args(parser)  # the trainer's flags, beside the launcher's own
    flags = {opt for action in parser._actions for opt in action.option_strings
             if opt.startswith("--") and opt != "--help"}
    assert len(flags) > 25  # launch and training flags both came through
    documented = set(re.findall(r"`(--[a-z0-9-]+)", README))
    assert sorted(flags - documented) == []
    assert sorted(documented - flags) == []  # nor documents a flag that no longer exists


def test_every_exit_code_is_documented() -> None:
    from reference_trainer.health import EXIT_CODES

    for reason, code in EXIT_CODES.items():
        row = rf"\| {code} \| " + ("\\|" if reason == "usage" else f"`{reason}`")
        assert re.search(row, README), f"no row for exit code {code} ({reason})"
