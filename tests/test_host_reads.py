"""How often a training step reads the device from the host (each read waits for the GPU to finish the work before
it): once a step, the loss and gradient norm that the instruments judge before the update, whatever the logging.
Counted on the CPU by the Python calls that read a tensor's values, from train.py and the instruments (data.py's
batch offsets are drawn on the host)."""
import os
import sys

import pytest
import torch

from conftest import run, tiny

READS = ("item", "tolist", "__float__", "__int__", "__bool__")


def reads_of_a_run(monkeypatch, corpus, folder, *flags):
    """The reads of the device's values that a tiny run made outside data.py, training and evaluating."""
    calls = []

    def counted(name):
        original = getattr(torch.Tensor, name)

        def read(tensor, *args, **kwargs):
            caller = os.path.basename(sys._getframe(1).f_code.co_filename)
            if caller != "data.py":
                calls.append((caller, name))
            return original(tensor, *args, **kwargs)
        return read

    with monkeypatch.context() as patch:
        for name in READS:
            patch.setattr(torch.Tensor, name, counted(name))
        assert run(corpus, folder, *tiny(eval_interval=1000, log_interval=1), *flags) == 0
    return calls


@pytest.mark.parametrize("flags, per_step", [([], 1), (["--fp16_overflow_fails=True"], 2)])
def test_a_training_step_reads_the_device_once(monkeypatch, corpus, tmp_path, flags, per_step):
    """Two runs that differ only in their steps (4 and 10, evaluated at the start and the end, a progress line every
    step): the six more steps make six more reads, one of each step's loss and gradient norm (runtime.host_read);
    --fp16_overflow_fails reads the maxima of the step's own forward too, for its verdict before the update."""
    short = reads_of_a_run(monkeypatch, corpus, tmp_path / "short", "--max_iters=4", *flags)
    long = reads_of_a_run(monkeypatch, corpus, tmp_path / "long", "--max_iters=10", *flags)
    assert len(long) - len(short) == 6 * per_step, long
    extra = list(long)
    for call in short:
        extra.remove(call)
    assert extra.count(("runtime.py", "tolist")) == 6  # the one read of each step
