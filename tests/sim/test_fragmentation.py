"""The FGD fragmentation measure: known cases by hand, and the vectorised index against it."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_pool.engine.fragmentation import (
    FleetFragmentation,
    TaskShape,
    WorkloadMix,
    expected_fragment,
    fragment_delta,
    task_fragment,
)

ONE_GPU = TaskShape(1, 1000, cpu_milli=4000)
HALF = TaskShape(1, 500, cpu_milli=2000)
TWO_GPUS = TaskShape(2, 1000)
CPU_ONLY = TaskShape(0, 0, cpu_milli=1000)
T4_ONLY = TaskShape(1, 1000, gpu_models=frozenset({"T4"}))


@pytest.mark.parametrize(
    ("free", "cpu", "model", "shape", "expected"),
    [
        ((1000, 1000), 8000, "G2", ONE_GPU, 0),  # fits on full cards: nothing lost
        ((1000, 300), 8000, "G2", ONE_GPU, 300),  # the 300 left on a shared card is lost
        ((300, 300), 8000, "G2", ONE_GPU, 600),  # cannot run at all: all free is lost
        ((1000, 300), 8000, "G2", HALF, 300),
        ((600, 300), 8000, "G2", HALF, 300),
        ((1000, 1000), 1000, "G2", ONE_GPU, 2000),  # short of CPU: all lost
        ((1000, 700), 8000, "G2", TWO_GPUS, 1700),  # only one full card for a 2-GPU task
        ((1000, 1000), 8000, "G2", CPU_ONLY, 2000),  # a CPU task uses no GPU
        ((1000,), 8000, "G2", T4_ONLY, 1000),  # model refused
        ((1000,), 8000, "T4", T4_ONLY, 0),
        ((0, 0), 8000, "G2", ONE_GPU, 0),  # nothing free, nothing lost
    ],
)
def test_task_fragment_known_cases(free, cpu, model, shape, expected) -> None:
    assert task_fragment(free, cpu, 10**6, model, shape) == expected


def test_memory_counts_when_the_shape_asks_for_it() -> None:
    shape = TaskShape(1, 1000, memory_mib=4096)
    assert task_fragment((1000,), 8000, 2048, None, shape) == 1000
    assert task_fragment((1000,), 8000, 4096, None, shape) == 0


def test_mix_keeps_the_most_frequent_shapes_up_to_coverage() -> None:
    shapes = [ONE_GPU] * 6 + [HALF] * 3 + [TWO_GPUS]
    mix = WorkloadMix.from_shapes(shapes, coverage=0.85)
    assert mix.shapes == (ONE_GPU, HALF)
    assert mix.weights == pytest.approx((6 / 9, 3 / 9))
    assert WorkloadMix.from_shapes(shapes).weights == pytest.approx((0.6, 0.3, 0.1))


def test_expected_fragment_and_delta() -> None:
    mix = WorkloadMix((ONE_GPU, HALF), (0.5, 0.5))
    # free (1000, 1000): a half share on GPU 1 leaves (1000, 500): ONE_GPU loses 500, HALF 0.
    assert expected_fragment((1000, 1000), 8000, 10**6, None, mix) == 0
    assert fragment_delta((1000, 1000), 8000, 10**6, None, mix, {1: 500}, 2000) == 250
    # The same share on a card already at 500 fills it: nothing is lost at all.
    assert fragment_delta((1000, 500), 8000, 10**6, None, mix, {1: 500}, 2000) == -250


def test_from_snapshot_mix() -> None:
    mix = WorkloadMix.from_snapshot((((1, 1000), 3.0), ((1, 500), 1.0), ((0, 0), 0.0)))
    assert mix.shapes == (TaskShape(1, 1000), TaskShape(1, 500))
    assert mix.weights == pytest.approx((0.75, 0.25))


def _random_fleet(rng: np.random.Generator, n: int):
    gpus = rng.choice([0, 1, 2, 4, 8], size=n)
    free = np.zeros((n, 8), dtype=np.int64)
    for i, g in enumerate(gpus):
        free[i, :g] = rng.choice([0, 100, 250, 500, 700, 1000], size=g)
    cpu = rng.integers(0, 64, size=n) * 1000
    mem = rng.integers(0, 64, size=n) * 1024
    models = [str(m) for m in rng.choice(["G2", "T4", "P100"], size=n)]
    return free, cpu, mem, models


def test_fleet_index_matches_the_scalar_definition() -> None:
    rng = np.random.default_rng(7)
    free, cpu, mem, models = _random_fleet(rng, 60)
    free[free.sum(axis=1) == 0, :] = -1  # absent GPUs as FleetState writes them
    shapes = [
        ONE_GPU, HALF, TWO_GPUS, CPU_ONLY, T4_ONLY, TaskShape(1, 250, 1000, 8192),
        TaskShape(4, 1000, 16000), TaskShape(8, 1000, 32000, 65536),
    ]
    mix = WorkloadMix(tuple(shapes), tuple(rng.dirichlet(np.ones(len(shapes)))))
    index = FleetFragmentation(free, cpu, mem, models, mix)
    for n in range(len(models)):
        row = [int(v) for v in free[n] if v >= 0]
        want = expected_fragment(row, int(cpu[n]), int(mem[n]), models[n], mix)
        assert index.frag[n] == pytest.approx(want)
    nodes = np.arange(len(models))
    # Whole-GPU deltas wherever at least two cards are fully free.
    ok = nodes[(free == 1000).sum(axis=1) >= 2]
    got = index.delta_whole(ok, 2, 1000, 1024)
    for i, n in enumerate(ok):
        full = [g for g in range(8) if free[n, g] == 1000][:2]
        want = fragment_delta(list(free[n]), int(cpu[n]), int(mem[n]), models[n], mix,
                              {g: 1000 for g in full}, 1000, 1024)
        assert got[i] == pytest.approx(want)
    # Share deltas on every card with at least 250 free.
    nn, gg = np.nonzero(free >= 250)
    got = index.delta_share(nn, gg, 250, 500, 512)
    for i, (n, g) in enumerate(zip(nn, gg, strict=True)):
        want = fragment_delta(list(free[n]), int(cpu[n]), int(mem[n]), models[n], mix,
                              {int(g): 250}, 500, 512)
        assert got[i] == pytest.approx(want)
    # After a change and a refresh the cache agrees again.
    free[ok[0], :2] = 0
    cpu[ok[0]] -= 500
    index.refresh([ok[0]])
    n = int(ok[0])
    want = expected_fragment(list(free[n]), int(cpu[n]), int(mem[n]), models[n], mix)
    assert index.frag[n] == pytest.approx(want)


def test_a_fleet_built_in_slices_matches_the_scalar_definition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_pool.engine.fragmentation as fragmentation

    # Slices of a few rows (8 GPUs x 3 shapes = 24 cells a row, 50 cells a slice: 2 rows).
    monkeypatch.setattr(fragmentation, "_REFRESH_CELLS", 50)
    rng = np.random.default_rng(11)
    free, cpu, mem, models = _random_fleet(rng, 9)
    mix = WorkloadMix((ONE_GPU, HALF, T4_ONLY), (0.5, 0.3, 0.2))
    index = FleetFragmentation(free, cpu, mem, models, mix)
    for n in range(len(models)):
        want = expected_fragment([int(v) for v in free[n]], int(cpu[n]), int(mem[n]),
                                 models[n], mix)
        assert index.frag[n] == pytest.approx(want)
