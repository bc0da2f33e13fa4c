"""Timing shared by the benchmarks: median seconds per call, CUDA synchronised around samples."""
import statistics
import time

import torch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_time(fn, number: int, repeat: int, device: str = "cpu", warmup: int = 3) -> float:
    """Median seconds per call over ``repeat`` samples of ``number`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync(device)
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)
