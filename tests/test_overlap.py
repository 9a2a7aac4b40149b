"""Communication time arithmetic (hand-computed) and the event-to-interval extraction."""
from types import SimpleNamespace

import pytest

from ddlbench.comm.exposed import cpu_intervals, gloo_kind, kernel_kind
from ddlbench.metrics.comm import comm_time
from ddlbench.metrics.overlap import intersection, length, overlap_summary, subtract, union


def test_interval_arithmetic():
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert length([(0, 1), (0.5, 2), (5, 5)]) == 2
    assert intersection([(0, 2), (3, 6)], [(1, 4)]) == [(1, 2), (3, 4)]
    assert subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert subtract([(0, 1)], [(0, 1)]) == []


def test_overlap_summary():
    # all-reduce 0-4 while compute runs 0-3: 3 s hidden, 1 s exposed; all-gather 5-6 with no compute
    comm = {"all_reduce": [(0, 4)], "all_gather": [(5, 6)]}
    out = overlap_summary(comm, [(0, 3), (4, 5)])
    assert out["kinds"]["all_reduce"] == {"count": 1, "time_s": 4, "overlapped_s": 3, "exposed_s": 1}
    assert out["kinds"]["all_gather"]["exposed_s"] == 1
    assert (out["time_s"], out["overlapped_s"], out["exposed_s"], out["compute_s"]) == (5, 3, 2, 4)


def test_comm_time_means_over_ranks_and_busbw():
    r0 = {"kinds": {"all_reduce": {"count": 1, "time_s": 0.2, "overlapped_s": 0.1, "exposed_s": 0.1}},
          "time_s": 0.2, "overlapped_s": 0.1, "exposed_s": 0.1, "compute_s": 1.0}
    r1 = {"kinds": {"all_reduce": {"count": 1, "time_s": 0.4, "overlapped_s": 0.0, "exposed_s": 0.4}},
          "time_s": 0.4, "overlapped_s": 0.0, "exposed_s": 0.4, "compute_s": 1.0}
    out = comm_time([r0, r1], {"all_reduce": 3e8}, world=2)
    ar = out["kinds"]["all_reduce"]
    assert ar["time_s"] == pytest.approx(0.3) and ar["exposed_s"] == pytest.approx(0.25)
    assert ar["busbw_Bps"] == pytest.approx(1e9)        # 3e8 B / 0.3 s x 2(2-1)/2
    assert out["exposed_fraction"] == pytest.approx(0.25 / 0.3)


def test_periods_are_split_at_the_markers_and_their_spread_kept():
    """Three periods of 2 steps between markers at 0, 10, 20, 30. Period 1: all-reduce 1-5 while
    compute runs 0-4 and 8-10 (6 s; 3 hidden); period 2: all-reduce 12-20 (8 s), compute 8-14 cut to
    10-14 (2 hidden); period 3: all-reduce 29-31 (starts in it: 2 s, no compute), all-gather 21-22
    while compute 20-25. Per step (/2): all-reduce 2, 4, 1 s; mean 7/3; totals 2, 4, 1.5."""
    from ddlbench.comm.exposed import split_periods
    comm = {"all_reduce": [(1, 5), (12, 20), (29, 31)], "all_gather": [(21, 22)]}
    out = split_periods(comm, [(0, 4), (8, 14), (20, 25)], [0, 10, 20, 30], steps=2)
    assert [p["kinds"].get("all_reduce") for p in out["periods"]] == [2, 4, 1]
    assert [p["time_s"] for p in out["periods"]] == [2, 4, 1.5]
    assert [p["exposed_s"] for p in out["periods"]] == [0.5, 3, 1]
    assert out["kinds"]["all_reduce"]["time_s"] == pytest.approx(7 / 3)
    assert out["kinds"]["all_gather"] == pytest.approx({"count": 1 / 6, "time_s": 1 / 6, "overlapped_s": 1 / 6,
                                                        "exposed_s": 0})
    assert out["compute_s"] == pytest.approx((6 + 4 + 5) / 6) and out["steps"] == 2
    # no markers (an older caller): one period, everything in it
    assert split_periods(comm, [], [], steps=1)["time_s"] == 4 + 8 + 2 + 1
    # over ranks: each period's mean over the ranks, then its fastest, median and slowest
    r0, r1 = ({"kinds": {"all_reduce": {"count": 1, "time_s": t, "overlapped_s": 0.0, "exposed_s": t}},
               "time_s": t, "overlapped_s": 0.0, "exposed_s": t, "compute_s": 1.0,
               "periods": [{"time_s": x, "exposed_s": x, "kinds": {"all_reduce": x}} for x in xs]}
              for t, xs in ((0.2, (0.1, 0.3, 0.2)), (0.4, (0.5, 0.3, 0.4))))
    got = comm_time([r0, r1], {"all_reduce": 3e8}, world=2)
    assert got["periods"] == 3 and got["time_s_spread"] == pytest.approx([0.3, 0.3, 0.3])
    assert got["kinds"]["all_reduce"]["time_s_spread"] == pytest.approx([0.3, 0.3, 0.3])
    r1["periods"][0] = {"time_s": 0.9, "exposed_s": 0.9, "kinds": {"all_reduce": 0.9}}
    assert comm_time([r0, r1], {}, world=2)["kinds"]["all_reduce"]["time_s_spread"] == pytest.approx([0.3, 0.3, 0.5])


def _ev(name, thread, start_us, end_us, parent=None):
    return SimpleNamespace(name=name, thread=thread, cpu_parent=parent,
                           time_range=SimpleNamespace(start=start_us, end=end_us, elapsed_us=lambda: end_us - start_us))


def test_cpu_intervals_from_profiler_events():
    fwd = _ev("DistributedDataParallel.forward", 1, 0, 100)
    bwd = _ev("autograd::engine::evaluate_function: AddmmBackward0", 1, 100, 300)
    wait = _ev("c10d::wait", 1, 250, 300, parent=bwd)       # blocked inside backward
    ar = _ev("gloo:all_reduce", 2, 200, 300)                 # on gloo's thread
    comm, compute = cpu_intervals([fwd, bwd, wait, ar])
    assert comm == {"all_reduce": [(200e-6, 300e-6)]}
    assert compute == [(0.0, 250e-6)]
    s = overlap_summary(comm, compute)
    assert s["overlapped_s"] == pytest.approx(50e-6) and s["exposed_s"] == pytest.approx(50e-6)


def test_cuda_intervals_from_kernel_events():
    """The CUDA branch: kernels on the device timeline (torch's DeviceType.CUDA), NCCL kernels by
    kind, everything else compute; CPU-side events ignored (the device's time is what overlaps)."""
    from torch.autograd import DeviceType

    from ddlbench.comm.exposed import cuda_intervals

    def k(name, start_us, end_us, device=DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start_us, end=end_us))
    events = [k("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 100), k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 60, 160),
              k("ncclDevKernel_AllGather_RING_LL", 200, 250), k("elementwise_kernel", 160, 190),
              k("aten::mm", 0, 300, device=DeviceType.CPU), k("cudaLaunchKernel", 5, 6, device=DeviceType.CPU)]
    comm, compute = cuda_intervals(events)
    assert comm == {"all_reduce": [(60e-6, 160e-6)], "all_gather": [(200e-6, 250e-6)]}
    assert compute == [(0.0, 100e-6), (160e-6, 190e-6)]
    s = overlap_summary(comm, compute)
    assert s["overlapped_s"] == pytest.approx(40e-6) and s["exposed_s"] == pytest.approx(110e-6)


def test_kind_names():
    assert gloo_kind("gloo:all_reduce") == "all_reduce" and gloo_kind("aten::mm") is None
    assert kernel_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "all_reduce"
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce_scatter"
    assert kernel_kind("ampere_sgemm_128x64_tn") is None


def test_kineto_noise_is_held_back_and_other_stderr_passes(capfd):
    import os

    from ddlbench.comm.exposed import quiet_kineto
    with quiet_kineto():
        os.write(2, b"USDT:2026-11-23 10:41:02 1:1 SyncActivityProfilerHandler.cpp:39] profiler_start\n")
        os.write(2, b"ERROR:2026-11-23 10:41:02 1:1 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35\n")
        os.write(2, b"a real warning\n")
    err = capfd.readouterr().err
    assert err == "a real warning\n"
