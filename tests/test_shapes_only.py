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
