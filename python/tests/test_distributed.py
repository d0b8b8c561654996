"""Context parallelism (flashcore.distributed) on 2 GPUs: distributed_worker.py under torchrun,
every rank checked against FlashCore on one GPU. Needs a machine with at least 2 GPUs."""
import os
import subprocess
import sys

import pytest
import torch

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="context parallelism needs at least 2 GPUs")
def test_ring_zigzag_and_varlen_match_one_gpu_and_bad_input_fails_on_every_rank():
    world = min(torch.cuda.device_count(), 4)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", WORKER],
        capture_output=True, text=True, timeout=600,
    )
    print(run.stdout[-20000:], run.stderr[-5000:])
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    assert run.stdout.count("done: 0 failed") == world
