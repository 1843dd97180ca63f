"""A test double of a mercurial rank: the reference trainer, with a rank's parameters changed
right after one of its optimizer steps, as a corrupted update would leave them.

``python tests/integration/diverge_rank.py RANK:STEP[:SCALE] ... -- <trainer flags>``: after
the STEP-th optimizer step of the process on RANK, the first element of its shard of the token
embedding is scaled by 1 + 1e-3 (invisible in the loss), or, with SCALE, its whole shard of
the output head's weight (the next-to-last parameter) by SCALE (which its own loss shows). The
change comes from torch's global optimizer step hook (``register_optimizer_step_post_hook``):
the trainer runs unchanged.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from reference_trainer import train


def main() -> None:
    sep = sys.argv.index("--")
    nudges = [spec.split(":") for spec in sys.argv[1:sep]]
    rank = os.environ["RANK"]
    steps = 0

    def nudge(optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
        nonlocal steps
        steps += 1
        params = optimizer.param_groups[0]["params"]
        for victim, at_step, *scale in nudges:
            if victim != rank or int(at_step) != steps:
                continue
            with torch.no_grad():
                if scale:
                    params[-2].to_local().mul_(float(scale[0]))
                else:
                    params[0].to_local().view(-1)[0] *= 1.0 + 1e-3

    register_optimizer_step_post_hook(nudge)
    code = train.main(sys.argv[sep + 1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as train.py's __main__ does (gloo's abort at interpreter exit)


if __name__ == "__main__":
    main()
