"""A test double of a mercurial rank: the reference trainer, with one rank's first parameter
nudged by a relative 1e-3 right after one optimizer step, as a corrupted update would leave it.

``python tests/integration/diverge_rank.py RANK STEP -- <trainer flags>``. The nudge comes from
a global optimizer step hook of torch's (``register_optimizer_step_post_hook``): the trainer is
run unchanged. Step counts are per process: STEP is the process's STEP-th optimizer step.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from reference_trainer import train


def main() -> None:
    victim, at_step, sep, *argv = sys.argv[1:]
    assert sep == "--", f"usage: {sys.argv[0]} RANK STEP -- <trainer flags>"
    steps = 0

    def nudge(optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
        nonlocal steps
        steps += 1
        if steps == int(at_step) and os.environ["RANK"] == victim:
            param = optimizer.param_groups[0]["params"][0]
            with torch.no_grad():
                param.to_local().view(-1)[0] *= 1.0 + 1e-3

    register_optimizer_step_post_hook(nudge)
    code = train.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as train.py's __main__ does (gloo's abort at interpreter exit)


if __name__ == "__main__":
    main()
