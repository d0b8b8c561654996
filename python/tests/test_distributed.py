"""Context parallelism (flashcore.distributed) under torchrun: on 2-4 GPUs distributed_worker.py
(the attention functions) and distributed_llama_worker.py (a transformers Llama training step),
every rank checked against FlashCore on one GPU; on any machine distributed_logic_worker.py, the
layer's orchestration on 3 CPU processes over gloo with a float64 stand-in for the kernels."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(__file__)
NEEDS_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="context parallelism needs at least 2 GPUs")


def passes_on_every_rank(worker: str, world: int = 0) -> None:
    """Runs `worker` on `world` processes (default: a GPU each, up to 4) under torchrun; every
    rank must print "done: 0 failed"."""
    world = world or min(torch.cuda.device_count(), 4)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", os.path.join(HERE, worker)],
        capture_output=True, text=True, timeout=600,
    )
    print(run.stdout[-20000:], run.stderr[-5000:])
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    assert run.stdout.count("done: 0 failed") == world


@NEEDS_GPUS
def test_ring_zigzag_and_varlen_match_one_gpu_and_bad_input_fails_on_every_rank():
    passes_on_every_rank("distributed_worker.py")


@NEEDS_GPUS
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_llama_training_step_with_the_sequence_split_matches_one_gpu():
    passes_on_every_rank("distributed_llama_worker.py")


def test_ring_orchestration_on_three_cpu_processes_matches_a_float64_reference():
    passes_on_every_rank("distributed_logic_worker.py", world=3)
