"""AdamW on the rows a step touched: the optimizer step of a catalog-sized table in time that
does not grow with the catalog (optim.lazy_rows).

With sparse item gradients (dist.sparse_gradients) a step's gradient holds a few thousand rows
of a table that may have 10^6. AdamW proper still moves every row every step (an untouched
row's momentum keeps pushing it for a while), so its step reads and writes the whole table and
its two moments: at 10^6 items and dim 64 that was most of a 2-core CPU step. Here, as
TensorFlow's LazyAdam does, only the touched rows and their moments move; every other row is
left as it is until a step touches it again. The step count and the bias corrections stay
global, and the state lives where AdamW keeps it (optimizer.state[table], the same keys), so a
checkpoint resumes under either setting.

The trainer takes these tables' gradients off before the optimizer's own step (AdamW skips a
parameter without one), clips them with the rest (`clip_grad_norm_`), and calls `step_rows`
when the optimizer stepped.
"""

from __future__ import annotations

import torch

RowGradient = tuple[torch.Tensor, torch.Tensor]  # (row indices, their gradient rows)


def describe(lazy: bool, sparse: bool) -> str:
    """The end of the training log's item-gradient line. optim.lazy_rows applies where item
    gradients are sparse; elsewhere (a catalog small enough for the exact loss under
    model.loss=auto) it does nothing, which a config shared across catalogs should allow."""
    if not lazy:
        return ""
    return ("; AdamW moves only those rows (optim.lazy_rows)" if sparse else
            "; optim.lazy_rows does nothing here (it needs sparse item gradients)")


def take_row_gradients(tables: list[torch.nn.Parameter]) -> dict[torch.nn.Parameter, RowGradient]:
    """Each table's sparse gradient as (rows, values), one entry per row (the exchange may have
    gathered a row once per rank), and the table left without a gradient."""
    rows = {}
    for table in tables:
        if table.grad is None:
            continue
        grad = table.grad.coalesce()
        rows[table] = (grad.indices()[0], grad.values())
        table.grad = None
    return rows


@torch.no_grad()
def clip_grad_norm_(params, row_grads: list[RowGradient], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the dense gradients and the taken row gradients
    together (the norm of the whole gradient, as if the rows were dense); returns that norm.
    Without row gradients it is torch's own."""
    if not row_grads:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    dense = [p.grad for p in params if p.grad is not None]
    norms = [torch.linalg.vector_norm(g) for g in dense]
    norms += [torch.linalg.vector_norm(values) for _, values in row_grads]
    if not norms:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack(norms))
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in dense + [values for _, values in row_grads]:
        grad.mul_(factor)
    return total


@torch.no_grad()
def step_rows(optimizer: torch.optim.AdamW, table: torch.nn.Parameter, rows: RowGradient) -> None:
    """One AdamW step (decoupled weight decay, bias-corrected moments) on `rows` of `table`,
    the same arithmetic as torch's single-tensor AdamW applied to those rows alone."""
    group = next(g for g in optimizer.param_groups if any(p is table for p in g["params"]))
    index, grad = rows
    state = optimizer.state[table]
    if not state:  # as AdamW starts a state; create_optimizer_state has usually done it
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(table)
        state["exp_avg_sq"] = torch.zeros_like(table)
    state["step"] += 1
    step = float(state["step"])
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    beta1, beta2 = group["betas"]
    param, exp_avg, exp_avg_sq = table[index], state["exp_avg"][index], state["exp_avg_sq"][index]
    param.mul_(1 - lr * wd)
    exp_avg.lerp_(grad.to(exp_avg.dtype), 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
    table.index_copy_(0, index, param)
    state["exp_avg"].index_copy_(0, index, exp_avg)
    state["exp_avg_sq"].index_copy_(0, index, exp_avg_sq)
