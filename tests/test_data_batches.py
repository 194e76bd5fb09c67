"""get_batch: random windows, reproducible from the generator state; eval_batches: one fixed set."""
import numpy as np
import torch

from data import eval_batches, get_batch

TOKENS = np.arange(1000, dtype=np.uint16)  # every window is then an arithmetic run, easy to check


def test_windows_are_consecutive_tokens_and_y_is_x_shifted():
    x, y = get_batch(TOKENS, 8, 32, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y[:, -1], x[:, -1] + 1)
    assert torch.equal(x, x[:, :1] + torch.arange(32))
    assert int(y.max()) < len(TOKENS)


def test_batches_repeat_exactly_from_a_saved_generator_state():
    generator = torch.Generator().manual_seed(1)
    get_batch(TOKENS, 4, 16, generator)
    state = generator.get_state()
    after = get_batch(TOKENS, 4, 16, generator)
    generator.set_state(state)
    assert torch.equal(get_batch(TOKENS, 4, 16, generator)[0], after[0])
    assert not torch.equal(get_batch(TOKENS, 4, 16, generator)[0], after[0])


def test_random_windows_reach_both_ends_of_the_stream():
    short = TOKENS[:20]
    x, y = get_batch(short, 400, 8, torch.Generator().manual_seed(2))
    assert int(x.min()) == 0 and int(y.max()) == 19


def test_eval_batches_are_fixed_and_span_the_stream():
    batches = eval_batches(TOKENS, 4, 16, 12)
    again = eval_batches(TOKENS, 4, 16, 12)
    assert len(batches) == 3
    assert all(torch.equal(x, x2) and torch.equal(y, y2) for (x, y), (x2, y2) in zip(batches, again))
    starts = torch.cat([x[:, 0] for x, _ in batches])
    assert int(starts[0]) == 0 and int(batches[-1][1][-1, -1]) == len(TOKENS) - 1
    assert len(set(starts.tolist())) == 12


def test_the_val_windows_do_not_depend_on_the_batch_size():
    """The same windows in batches of 4, 5 (the last one holding the remaining 2) or 12: a run's val set
    is fixed by train.eval_tokens alone, whatever its batch size and number of processes."""
    windows = {size: torch.cat([x for x, _ in eval_batches(TOKENS, size, 16, 12)]) for size in (4, 5, 12)}
    assert [len(x) for x, _ in eval_batches(TOKENS, 5, 16, 12)] == [5, 5, 2]
    assert torch.equal(windows[4], windows[5]) and torch.equal(windows[4], windows[12])
