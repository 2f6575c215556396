"""When the trainer opens the next epoch's reader (pure logic; the multi-epoch runs in
test_train.py exercise the real readers, including a resume that must be bitwise exact)."""

from types import SimpleNamespace

from hvd_ctsm.train.loop import read_ahead_now


def make_run(steps: int, epochs: int, read_ahead_steps: int):
    data = SimpleNamespace(read_ahead_steps=read_ahead_steps)
    return SimpleNamespace(plan=SimpleNamespace(steps=steps),
                           cfg=SimpleNamespace(epochs=epochs, data=data))


def opened_after(run, epoch: int, stop_at: int = 10**6) -> list[int]:
    """The steps of an epoch after which read_ahead_now says yes."""
    first = epoch * run.plan.steps
    return [done for done in range(1, run.plan.steps + 1)
            if read_ahead_now(run, epoch, done, first + done, stop_at)]


def test_the_next_reader_opens_read_ahead_steps_before_the_epoch_ends():
    assert opened_after(make_run(steps=10, epochs=3, read_ahead_steps=4), epoch=0)[0] == 6


def test_zero_opens_it_when_the_epoch_ends():
    assert opened_after(make_run(steps=10, epochs=3, read_ahead_steps=0), epoch=1) == [10]


def test_no_reader_after_the_last_epoch_or_past_max_steps():
    run = make_run(steps=10, epochs=3, read_ahead_steps=4)
    assert opened_after(run, epoch=2) == []
    assert opened_after(run, epoch=0, stop_at=8) == []  # the run stops inside this epoch
    assert opened_after(run, epoch=0, stop_at=10) == []  # ... or just as it ends
    assert opened_after(run, epoch=0, stop_at=11)[0] == 6  # one step of the next epoch
