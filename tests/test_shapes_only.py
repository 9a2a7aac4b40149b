"""ddlbench/project/shapes_only.py: inside ShapesOnly a matrix product of plain tensors is the
product's shape, stride and dtype, uncomputed; the rest of the step computes as it would, so a
traced step's collectives keep their sizes (the trace tests in test_estimate.py hold those)."""
import torch

from ddlbench.project.shapes_only import ShapesOnly


def test_products_keep_their_shape_and_dtype_and_nothing_else_changes():
    a, b = torch.ones(3, 4, dtype=torch.bfloat16), torch.ones(4, 5, dtype=torch.bfloat16)
    with ShapesOnly() as mode:
        mm = a @ b
        lin = torch.nn.functional.linear(torch.ones(2, 4), torch.ones(6, 4), torch.ones(6))   # addmm
        bmm = torch.ones(2, 3, 4).bmm(torch.ones(2, 4, 7))
        added = a + 1                                     # not a product: computed
        on_meta = torch.ones(3, 4, device="meta") @ torch.ones(4, 2, device="meta")
    assert (mm.shape, mm.dtype, mm.stride()) == ((3, 5), torch.bfloat16, (5, 1))
    assert lin.shape == (2, 6) and bmm.shape == (2, 3, 7) and mm.device.type == "cpu"
    assert torch.equal(added, torch.full((3, 4), 2.0, dtype=torch.bfloat16))
    assert on_meta.device.type == "meta" and mode.skipped == 3
    assert torch.equal(a @ b, torch.full((3, 5), 4.0, dtype=torch.bfloat16))   # outside: computed


def test_a_backward_under_it_gives_every_gradient_its_shape():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with ShapesOnly() as mode:
        model(torch.randn(5, 8)).sum().backward()
    assert [p.grad.shape for p in model.parameters()] == [p.shape for p in model.parameters()]
    assert mode.skipped == 5       # 2 forward products (a Parameter's bias too), 3 in backward (no input gradient for the first layer)


def test_large_results_are_uncomputed_small_ones_and_value_sized_ones_computed():
    big = torch.ones(64, 1024)                 # 256 KiB: over SMALL_BYTES
    small = torch.ones(4, 4)
    out = torch.zeros(64, 1024)
    with ShapesOnly() as mode:
        doubled = big * 2                      # uncomputed: storage of its shape
        kept = big.add_(1)                     # in place: the operand itself, left as it was
        torch.mul(big, 3, out=out)             # out=: `out` returned, not written
        total = big.sum()                      # a small result of a large input: computed
        where = torch.nonzero(big[:2])         # its size depends on values: computed
        tiny = small * 2                       # small: computed
        view = big.view(1024, 64)              # a view: aliases the operand
    assert doubled.shape == big.shape and doubled.dtype == big.dtype and doubled.data_ptr() != big.data_ptr()
    assert kept is big and torch.equal(big, torch.ones(64, 1024))
    assert torch.equal(out, torch.zeros(64, 1024))
    assert total.item() == 64 * 1024 and where.shape == (2 * 1024, 2)
    assert torch.equal(tiny, torch.full((4, 4), 2.0)) and view.data_ptr() == big.data_ptr()
    assert mode.skipped == 3


DTENSOR = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore
from ddlbench.project.shapes_only import ShapesOnly
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
x = DTensor.from_local(torch.ones(64, 1024), init_device_mesh("cpu", (4,)), [Shard(0)], run_check=False)
with ShapesOnly() as mode:
    y = x.sqrt()
    x.mul_(5)
assert isinstance(y, DTensor) and y.to_local().shape == (64, 1024) and y.placements == (Shard(0),)
assert torch.equal(x.to_local(), torch.ones(64, 1024)) and mode.skipped == 2, mode.skipped
print("ok")
"""


def test_a_dtensors_local_ops_come_through_it():
    """In a process of its own (a process group in this one would be inherited by the runs forked from it)."""
    import sys

    from conftest import run_bounded
    proc = run_bounded([sys.executable, "-c", DTENSOR], 120, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
