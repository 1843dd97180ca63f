"""The torch hooks an action hangs on the model: registered together, removed together.

The agent (``agent.py``) registers them when it arms an at-step action (removed at the next
step) or activates a window action (removed when its window ends or it is undone); which
hooks an action uses is ``faultlab.runtime.hooks``'s ``uses``. Only the hooks of the actions
armed or active now exist: a model with nothing planned pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faultlab.runtime.hooks import RankAction, uses

__all__ = ["model_hooks"]


def model_hooks(action: RankAction) -> list[Any]:
    """Register ``action``'s hooks on the model's parameters and modules; their handles.
    Whatever the action raises while listing them (``ActionError``: no such parameter or
    module) propagates, with nothing left registered."""
    cls = type(action)
    handles: list[Any] = []
    try:
        if uses(cls, "on_grads_ready"):
            for name, param in action.grads_to_watch():
                handles.append(param.register_post_accumulate_grad_hook(_ready(action, name)))
        if uses(cls, "after_module_forward"):
            for name, module in action.modules_to_watch():
                handles.append(module.register_forward_hook(_forward(action, name)))
        if uses(cls, "on_local_grad"):
            for name, param in action.grads_before_reduce():
                handles.append(param.register_hook(_local_grad(action, name)))
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return handles


def _ready(action: RankAction, name: str) -> Callable[[Any], None]:
    def hook(param: Any) -> None:
        action.on_grads_ready(name, param)
    return hook


def _forward(action: RankAction, name: str) -> Callable[[Any, Any, Any], Any]:
    def hook(module: Any, args: Any, output: Any) -> Any:
        return action.after_module_forward(name, module, args, output)
    return hook


def _local_grad(action: RankAction, name: str) -> Callable[[Any], Any]:
    def hook(grad: Any) -> Any:
        return action.on_local_grad(name, grad)
    return hook
