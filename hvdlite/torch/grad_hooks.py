"""The gradient hooks the DistributedOptimizer and the sharded optimizer share:
a call each time autograd has accumulated a parameter's gradient, and the check
that the gradient carries no graph."""

from __future__ import annotations

__all__ = ["check_no_graph", "on_grad_accumulated"]


def check_no_graph(grad) -> None:
    """AssertionError for a gradient that requires grad (Horovod's message)."""
    if grad is not None and grad.requires_grad:
        raise AssertionError(
            "DistributedOptimizer does not support gradients that "
            "require grad (backward(create_graph=True))"
        )


def on_grad_accumulated(p, hook):
    """Call hook(p) each time autograd has accumulated a gradient into p.grad;
    returns a handle whose ``remove()`` takes the hook off."""
    if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
        return p.register_post_accumulate_grad_hook(hook)
    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
    handle = accumulator.register_hook(lambda *_: hook(p))
    handle.accumulator = accumulator  # keep the node alive with its hook
    return handle
