"""AdamW on the rows a step touched, the other rows caught up when next touched: the
optimizer step of a catalog-sized table in time that does not grow with the catalog
(optim.lazy_rows).

With sparse item gradients (dist.sparse_gradients) a step's gradient holds a few thousand rows
of a table that may have 10^6. AdamW proper still moves every row every step (an untouched row
keeps moving by its momentum, and decays), so its step reads and writes the whole table and its
two moments: at 10^6 items and dim 64 that was most of a 2-core CPU step. A row no step reads
cannot change a loss, so its zero-gradient steps may wait: here each row remembers the step it
was last brought up to, and when a lookup reads it again (a forward pre-hook on its embedding),
the steps it missed are applied first in closed form (momentum decaying by beta1, the second
moment by beta2, weight decay); the optimizer step then moves the rows its gradient names.
`settle` brings every row up to date before anything reads the whole table (validation,
checkpoints, the final model, an elastic commit, the weight average).

The closed form takes the current step's lr and bias corrections for the missed steps, which
AdamW proper would have taken step by step, and counts eps as decaying with the second moment:
after warm-up, as long as a row's momentum lasts (about 1 / (1 - beta1) = 10 steps), lr barely
moves, and the unit tests bound the difference. Unlike TensorFlow's LazyAdam (which drops the
missed steps, so a rarely seen row moves about a tenth of what AdamW would move it), the rows
end where AdamW's end. The step count and both moments live where AdamW keeps them
(optimizer.state[table], the same keys), so a checkpoint resumes under either setting.

Under several ranks a row is caught up on the rank whose lookup reads it, among that rank's
rows, and on the others by the optimizer step, among other rows; so a row's catch-up must not
depend on its neighbours. On a CPU torch.exp and pow did: the same value got another last bit
in some places of a tensor than in others (a vectorized body and a scalar tail), and the ranks
drifted apart (a 10^6-item run under torchrun ended "ranks in sync: False" after 40 steps).
Here every per-row power goes through `exact_exp`, and sums over missed steps run in order
(cumsum), so a row's bits do not depend on what else shares the tensor.
"""

from __future__ import annotations

import contextlib
import math

import torch

RowGradient = tuple[torch.Tensor, torch.Tensor]  # (row indices, their gradient rows)
WINDOW = 64  # missed steps summed one by one; beyond them (beta1 / sqrt(beta2))^j < 0.0013
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # ln 2 in two parts
INV_LN2 = 1.44269504088896338700e00
EXP_TERMS = [1.0 / math.factorial(n) for n in range(14)]  # Taylor to r^13: |r| <= ln(2) / 2


def describe(lazy: bool, sparse: bool) -> str:
    """The end of the training log's item-gradient line."""
    return "; the optimizer moves only the rows a step reads (optim.lazy_rows)" if (
        lazy and sparse) else ""


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


def scaled_step(scaler, optimizer: torch.optim.Optimizer, lazy: LazyRows | None,
                rows: dict[torch.nn.Parameter, RowGradient], stepping=contextlib.nullcontext):
    """The AMP grad scaler's optimizer step (inside `stepping(optimizer)`, e.g. a backend's),
    then the rows' own step, unless the scaler skipped this step for an inf or nan: it lowers
    its scale when it does, and the rows must skip with it."""
    scale = scaler.get_scale() if scaler.is_enabled() else 1.0
    with stepping(optimizer):
        scaler.step(optimizer)
    scaler.update()
    if rows and (not scaler.is_enabled() or scaler.get_scale() >= scale):
        lazy.step(rows)


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
    total = torch.linalg.vector_norm(torch.stack(norms))
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in dense + [values for _, values in row_grads]:
        grad.mul_(factor)
    return total


class LazyRows:
    """The row-wise AdamW of an optimizer's sparse tables (embedding modules): a row is
    brought up to date when a lookup reads it (a forward pre-hook) and moved by `step`, after
    each optimizer step that ran; `settle` before the whole tables are read."""

    SETTLE_ROWS = 65_536  # rows caught up at a time by settle: bounded temporaries

    def __init__(self, optimizer: torch.optim.Optimizer, modules: list[torch.nn.Embedding]):
        self.optimizer, self.tables = optimizer, [m.weight for m in modules]
        # per table: (the state's step tensor it counts against, each row's step, int64)
        self._row_steps: dict[torch.nn.Parameter, tuple[torch.Tensor, torch.Tensor]] = {}
        self._history: dict[torch.nn.Parameter, StepHistory] = {}
        # Each table's param group by position: loading a state dict replaces the group dicts
        # but keeps their order and members.
        self._group_index = {table: next(i for i, g in enumerate(optimizer.param_groups)
                                         if any(p is table for p in g["params"]))
                             for table in self.tables}
        for module in modules:  # what a step reads is what AdamW proper would hold
            module.register_forward_pre_hook(lambda m, args: self.bring_up_to_date(m.weight,
                                                                                   args[0]))

    @torch.no_grad()
    def bring_up_to_date(self, table: torch.nn.Parameter, ids: torch.Tensor) -> None:
        """Apply to the rows `ids` names the steps they missed, up to the last step."""
        group, state = self._group_and_state(table)
        if not state:
            return
        row_steps, step = self._steps_of_rows(table, state), int(state["step"])
        ids = ids.reshape(-1)
        stale = ids[row_steps[ids] < step]  # before unique(): most lookups of a step find none
        if len(stale) == 0:
            return
        index = stale.unique()
        catch_up_rows(index, (table, state["exp_avg"], state["exp_avg_sq"]), row_steps[index],
                      step, self._history[table], group)
        row_steps[index] = step

    @torch.no_grad()
    def step(self, rows: dict[torch.nn.Parameter, RowGradient]) -> None:
        """One AdamW step on the given rows of each table (brought up to date first: their
        lookup has, on this rank or another), with the arithmetic of torch's single-tensor
        AdamW."""
        for table, (index, grad) in rows.items():
            group, state = self._group_and_state(table)
            row_steps = self._steps_of_rows(table, state)
            param, exp_avg, exp_avg_sq = rows_of(index, table, state["exp_avg"],
                                                 state["exp_avg_sq"])
            # Rows only other ranks read (their lookups caught them up there): caught up here,
            # in the copies the step moves, so each row is read and written once.
            stale = (row_steps[index] < int(state["step"])).nonzero().squeeze(1)
            if len(stale):
                catch_up_rows(stale, (param, exp_avg, exp_avg_sq), row_steps[index[stale]],
                              int(state["step"]), self._history[table], group)
            state["step"] += 1
            step = int(state["step"])
            self._history[table].record(step, group)
            lr, beta1, beta2 = group["lr"], *group["betas"]
            param.mul_(1 - lr * group["weight_decay"])
            exp_avg.lerp_(grad.to(exp_avg.dtype), 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(group["eps"])
            param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
            write_rows(index, (table, param), (state["exp_avg"], exp_avg),
                       (state["exp_avg_sq"], exp_avg_sq))
            row_steps[index] = step

    @torch.no_grad()
    def settle(self) -> None:
        """Bring every row of every table up to the last step (what AdamW proper would hold)."""
        for table in self.tables:
            group, state = self._group_and_state(table)
            if not state:
                continue
            row_steps, step = self._steps_of_rows(table, state), int(state["step"])
            for lo in range(0, table.shape[0], self.SETTLE_ROWS):
                block = slice(lo, lo + self.SETTLE_ROWS)
                if bool((row_steps[block] < step).any()):
                    catch_up(table[block], state["exp_avg"][block], state["exp_avg_sq"][block],
                             row_steps[block], step, self._history[table], group)
            row_steps.fill_(step)

    def _group_and_state(self, table: torch.nn.Parameter) -> tuple[dict, dict]:
        return self.optimizer.param_groups[self._group_index[table]], self.optimizer.state[table]

    def _steps_of_rows(self, table: torch.nn.Parameter, state: dict) -> torch.Tensor:
        """Each row's last step. Counted from a state's step tensor: a state loaded anew (a
        resume, an elastic reset: settled when saved) starts with every row up to date."""
        if not state:  # as AdamW starts a state; create_optimizer_state has usually done it
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(table)
            state["exp_avg_sq"] = torch.zeros_like(table)
        known = self._row_steps.get(table)
        if known is None or known[0] is not state["step"]:
            rows = torch.full((table.shape[0],), int(state["step"]), dtype=torch.int64,
                              device=table.device)
            known = self._row_steps[table] = (state["step"], rows)
            group = self._group_and_state(table)[0]
            self._history[table] = StepHistory(int(state["step"]), table.device, group)
        return known[1]


def rows_of(index: torch.Tensor, *tables: torch.Tensor) -> list[torch.Tensor]:
    """Copies of the `index` rows of each table (index_select: on CPU several times faster
    than advanced indexing at a few thousand rows of a 10^6-row table)."""
    return [table.index_select(0, index) for table in tables]


def write_rows(index: torch.Tensor, *pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Each (table, rows): the rows (from rows_of) written back at `index`."""
    for table, rows in pairs:
        table.index_copy_(0, index, rows)


def catch_up_rows(index: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                  row_steps: torch.Tensor, to_step: int, history: StepHistory,
                  group: dict) -> None:
    """catch_up on the `index` rows of (param, exp_avg, exp_avg_sq): whole tables in a
    lookup, the step's copies of its rows in the optimizer step."""
    rows = rows_of(index, *tables)
    catch_up(*rows, row_steps, to_step, history, group)
    write_rows(index, *zip(tables, rows, strict=True))


class StepHistory:
    """Per step since rows were last all up to date (`start`), what a missed step depends on:
    its lr, lr / bc1 * sqrt(bc2) and lr / bc1 (its move's factor where sqrt(v), or eps,
    dominates), the running sum of log(1 - lr wd) (a row's weight decay over any span of steps,
    in O(1)), and per step s, once s + WINDOW is recorded, each factor's sum over the WINDOW
    steps after s (`window_sum`: what a row last brought to s and missed them all moved) and the
    weight decay over them inverted (`window_keep`)."""

    NAMES = ("lr", "factor", "step_size", "log_keep", "factor_window", "step_size_window",
             "window_keep")

    def __init__(self, start: int, device: torch.device, group: dict):
        for name in self.NAMES:  # log_keep 0 at `start`: nothing decayed before it
            setattr(self, name, torch.zeros(start + 1024, dtype=torch.float64, device=device))
        self.start, self.decays = start, False  # decays: any step with weight decay
        beta1, beta2 = group["betas"]
        self.ratios = {"factor": beta1 / math.sqrt(beta2), "step_size": beta1}
        j = torch.arange(1, WINDOW + 1, dtype=torch.float64, device=device)
        self.powers = {name: ratio**j for name, ratio in self.ratios.items()}
        self._recent_keep: tuple[int, int, torch.Tensor] | None = None

    def record(self, step: int, group: dict) -> None:
        if step >= len(self.lr):
            for name in self.NAMES:
                values = getattr(self, name)
                setattr(self, name, torch.cat([values, torch.zeros_like(values)]))
        lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
        self.lr[step] = lr
        self.step_size[step] = lr / (1 - beta1**step)
        self.factor[step] = lr / (1 - beta1**step) * math.sqrt(1 - beta2**step)
        self.log_keep[step] = self.log_keep[step - 1] + math.log1p(-lr * wd)
        self.decays = self.decays or lr * wd != 0
        first = step - WINDOW
        if first >= self.start:
            decayed = exact_exp(self.log_keep[first] - self.log_keep[first + 1:step + 1])
            self.window_keep[first] = decayed[-1]
            for name, powers in self.powers.items():
                moves = getattr(self, name)[first + 1:step + 1] * powers * decayed
                getattr(self, f"{name}_window")[first] = moves.sum()

    def decay_between(self, since: torch.Tensor, until: torch.Tensor, now: int) -> torch.Tensor:
        """exp(log_keep[since] - log_keep[until]) for steps within WINDOW of step `now`: a ratio
        of two entries of one table, made once a step (the same on every rank)."""
        if self._recent_keep is None or self._recent_keep[0] != now:
            offset = max(self.start, now - WINDOW)
            self._recent_keep = (now, offset, exact_exp(self.log_keep[offset:now + 1]
                                                        - self.log_keep[now]))
        _, offset, keep = self._recent_keep
        return keep[since - offset] / keep[until - offset]


def catch_up(param: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
             row_steps: torch.Tensor, to_step: int, history: StepHistory, group: dict) -> None:
    """Apply, in place, to rows last brought up to `row_steps`, AdamW's steps up to `to_step`
    with zero gradients. The j-th step a row missed (step u) decays it by 1 - lr_u wd and moves
    it by lr_u / bc1_u * beta1^j m / (sqrt(beta2^j v / bc2_u) + eps). Summed over j, that is
    m * A / (sqrt(v) + eps * A / B) exactly where sqrt(v) dominates eps or eps dominates (A and
    B: the sums of the two extremes' factors), a harmonic blend between."""
    eps, (beta1, beta2) = group["eps"], group["betas"]
    last = row_steps.unsqueeze(1)
    missed = (to_step - last).clamp(min=0)
    if not bool((missed > 0).any()):
        return
    where_v, where_eps = missed_series(history, last, missed, to_step, group["weight_decay"])
    blend = torch.where(where_eps > 0, eps * where_v / where_eps, eps)  # eps: nothing missed
    direction = exp_avg / (exp_avg_sq.sqrt() + blend.to(exp_avg_sq.dtype))
    param.sub_(direction * where_v.to(param.dtype))
    # beta1^missed, beta2^missed and the weight decay since `last`, in one exact_exp
    logs = [missed.to(torch.float64) * math.log(beta) for beta in (beta1, beta2)]
    if history.decays:
        logs.append(history.log_keep[last + missed] - history.log_keep[last])
    factors = exact_exp(torch.cat(logs, 1)).to(param.dtype)
    exp_avg.mul_(factors[:, 0:1])
    exp_avg_sq.mul_(factors[:, 1:2])
    if history.decays:
        param.mul_(factors[:, 2:3])


SERIES = ("factor", "step_size")  # where sqrt(v) dominates eps, where eps dominates


def missed_series(history: StepHistory, last: torch.Tensor, missed: torch.Tensor, to_step: int,
                  weight_decay: float) -> list[torch.Tensor]:
    """Per SERIES name, [rows, 1]: sum over each row's missed steps j = 1..missed of the
    per-step factor at last + j, times its ratio^j, over the row's decay from last to last + j.
    The first WINDOW steps: step by step (rows that missed them all: the history's window_sum,
    computed once per step), a geometric series beyond (factor, lr and wd of the tail's
    centre)."""
    end = max(to_step, 1)
    totals = [torch.where(missed >= WINDOW, getattr(history, f"{name}_window")[last], 0.0)
              for name in SERIES]
    recent = ((missed > 0) & (missed < WINDOW)).squeeze(1).nonzero().squeeze(1)
    if len(recent):  # rows read within the window: step by step, as many as they missed
        k, since = missed[recent], last[recent]
        j = torch.arange(1, int(k.max()) + 1, device=last.device)
        step = (since + j).clamp(max=end)
        decay = history.decay_between(since, step, to_step) if history.decays else None
        for total, name in zip(totals, SERIES, strict=True):
            move = getattr(history, name)[step] * history.powers[name][:len(j)]
            if decay is not None:
                move = move * decay
            # in order, so the zeros past a row's own missed steps cannot regroup its sum
            total[recent] = torch.where(j <= k, move, 0.0).cumsum(1)[:, -1:]
    far = (missed > WINDOW).squeeze(1).nonzero().squeeze(1)
    if len(far):
        since, beyond = last[far], missed[far] - WINDOW
        centre = (since + WINDOW + beyond.clamp(max=10)).clamp(max=end)
        log_step_keep = history.log_keep[centre] - history.log_keep[centre - 1]  # log(1-lr wd)
        ratios = [history.ratios[name] for name in SERIES]
        powers = exact_exp(torch.cat([beyond * (math.log(ratio) - log_step_keep)
                                      for ratio in ratios], 1))  # rho^beyond, both series
        for i, (total, name, ratio) in enumerate(zip(totals, SERIES, ratios, strict=True)):
            first = (getattr(history, name)[centre] * ratio ** (WINDOW + 1)
                     * history.window_keep[since])
            rho = ratio / (1 - history.lr[centre] * weight_decay)
            series = torch.where(rho == 1, beyond.to(torch.float64),
                                 (1 - powers[:, i:i + 1]) / (1 - rho))
            total[far] += first * series
    return totals


def exact_exp(x: torch.Tensor) -> torch.Tensor:
    """exp of a float64 tensor from +, *, round and a power of two made from its bits, each
    rounded as IEEE says: a value gets the same bits wherever it sits in a tensor (torch.exp
    need not: see the module's docstring). Within 4e-16 of exp; below exp(-708), the smallest
    normal number's scale."""
    x = x.to(torch.float64).clamp(-708.0, 709.0)
    k = torch.round(x * INV_LN2)
    r = (x - k * LN2_HI) - k * LN2_LO
    poly = torch.full_like(r, EXP_TERMS[-1])
    for term in reversed(EXP_TERMS[:-1]):
        poly = poly * r + term
    return poly * ((k.to(torch.int64) + 1023) << 52).view(torch.float64)
