"""How many runs a batch puts on one GPU (grader.grading.batch.gpus): as many as its memory and the host's cores
allow, unless ``--jobs`` says otherwise."""

from __future__ import annotations

from grader.grading.batch import gpus


def test_jobs_on_a_gpu_follow_its_memory_and_the_hosts_cores():
    h100 = gpus.Gpu(0, "NVIDIA H100 80GB HBM3", "u", "0", 80 << 30)
    assert gpus.auto_jobs(h100, gpus=1, cores=16) == 8  # 16 cores: 2 per run
    assert gpus.auto_jobs(h100, gpus=8, cores=128) == 8  # capped
    assert gpus.auto_jobs(h100, gpus=1, cores=6) == 3
    assert gpus.auto_jobs(gpus.Gpu(0, "small", "u", "0", 24 << 30), gpus=1, cores=64) == 2  # 10 GiB a run
    assert gpus.auto_jobs(gpus.Gpu(0, "tiny", "u", "0", 4 << 30), gpus=1, cores=1) == 1
    slots = gpus.gpu_slots(None, 0, available=[h100], current=0)
    assert slots[0].capacity == gpus.auto_jobs(h100, gpus=1)
    assert gpus.gpu_slots(None, 3, available=[h100], current=0)[0].capacity == 3  # --jobs wins
