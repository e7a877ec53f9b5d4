"""torchvision's task models beyond classification: detection (a list of images and of target dicts in, a loss
dict out in training, a list of dicts in eval), segmentation, video, optical flow; and torchvision's own ops."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layerprof import LayerProf

from .conftest import hook_state
from .invariants import check_profile, parameter_modules_have_backward

torchvision = pytest.importorskip("torchvision")
from torchvision.models import detection  # noqa: E402
from torchvision.ops import DeformConv2d  # noqa: E402


def _images() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.rand(3, 96, 128, generator=generator), torch.rand(3, 112, 96, generator=generator)]


def _targets() -> list[dict[str, torch.Tensor]]:
    boxes = torch.tensor([[10.0, 12.0, 60.0, 70.0], [30.0, 20.0, 80.0, 90.0]])
    return [{"boxes": boxes.clone(), "labels": torch.tensor([1, 2])} for _ in range(2)]


def _faster_rcnn() -> nn.Module:
    """A Faster R-CNN small enough for a test: 96-128 pixel images, few proposals, a narrow box head."""
    torch.manual_seed(0)
    return detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=96, max_size=128, box_batch_size_per_image=32,
        rpn_batch_size_per_image=32, rpn_pre_nms_top_n_train=200, rpn_post_nms_top_n_train=100,
        rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=50)


class _Deformable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.offset = nn.Conv2d(4, 2 * 3 * 3, 3, padding=1)
        self.mask = nn.Conv2d(4, 3 * 3, 3, padding=1)
        self.deform = DeformConv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deform(x, self.offset(x), torch.sigmoid(self.mask(x)))


def test_a_deformable_convolution_counts_as_the_convolution_of_its_shapes() -> None:
    model, x = _Deformable(), torch.randn(2, 4, 8, 8, requires_grad=True)
    with LayerProf(model, metrics=("flops",)) as prof:
        model(x).sum().backward()
    record = prof.records["deform"]
    # out [2, 8, 8, 8], each element 4 input channels x 3x3 taps: 2 * (2*8*8*8) * (4*3*3) = 73,728; the bilinear
    # sampling and the mask are elementwise (0). Backward: the columns' and the weight's gradients, 2 x 73,728.
    assert record.flops_forward == 2 * (2 * 8 * 8 * 8) * (4 * 3 * 3) == 73_728
    assert record.flops_backward == 2 * 73_728
    assert not record.unknown_ops and prof.unknown_ops() == {}
    # the offset conv: 2 * (2*18*8*8) * (4*9) = 165,888; the mask conv 2 * (2*9*8*8) * 36 = 82,944
    assert prof.tree.flops_forward == 73_728 + 165_888 + 82_944


def test_roi_align_and_nms_are_known_and_free_in_a_detection_step() -> None:
    model = _faster_rcnn().train()
    with LayerProf(model, metrics=("flops",)) as prof:
        sum(model(_images(), _targets()).values()).backward()
    assert prof.unknown_ops() == {}  # was {'torchvision.nms': 2, 'torchvision.roi_align': 2, '..._backward': 2}
    pool = prof.records["roi_heads.box_roi_pool"]
    assert (pool.flops_forward, pool.flops_backward, pool.unknown_ops) == (0, 0, {})
    # the box head's fc6 is the step's biggest product: 2 images x 32 sampled RoIs, 256*7*7 -> 1024
    assert prof.records["roi_heads.box_head.fc6"].flops_forward == 2 * 64 * 256 * 7 * 7 * 1024
    assert "FLOPs leave out" not in prof.layerwise_summary(columns=("flops",), depth=1)
    model.eval()
    with torch.no_grad(), LayerProf(model, metrics=("flops",)) as prof:
        model(_images())
    assert prof.unknown_ops() == {}


def test_a_formula_of_the_users_for_a_torchvision_op_wins() -> None:
    from layerprof import register_flop_formula
    from layerprof.metrics.formulas import FLOP_FORMULAS

    op = torch.ops.torchvision.deform_conv2d
    register_flop_formula(op)(lambda *args, **kwargs: 7)
    try:
        model, x = _Deformable(), torch.randn(1, 4, 8, 8)
        with LayerProf(model, metrics=("flops",)) as prof:
            model(x)
        assert prof.records["deform"].flops_forward == 7
    finally:
        del FLOP_FORMULAS[op]


def test_the_shapes_meter_reads_the_image_batch_of_an_image_list() -> None:
    model = _faster_rcnn().eval()
    with torch.no_grad(), LayerProf(model, metrics=("shapes",)) as prof:
        model(_images())
    transform, rpn = prof.records["transform"], prof.records["rpn"]
    # the transform pads 96x128 and 112x96 to one batch of 128x128 (multiples of 32) and returns (ImageList, None):
    # was output_shapes == [] ("Out: ()" in the summary)
    assert transform.output_paths == ["0.tensors"] and transform.output_shapes == [[2, 3, 128, 128]]
    assert transform.input_shapes == [[3, 96, 128], [3, 112, 96]]
    # the RPN takes the ImageList first, then the FPN's features (stride 32 and 64 here: 4x4, 4x4, and 2x2 "pool")
    assert rpn.input_paths == ["0.tensors", "1.0", "1.1", "1.pool"]
    assert rpn.input_shapes == [[2, 3, 128, 128], [2, 256, 4, 4], [2, 256, 4, 4], [2, 256, 2, 2]]
    assert "Out: [2, 3, 128, 128]" in prof.layerwise_summary(columns=("output_shapes",), depth=1)
    # the detections: 50 proposals at most per image after the RPN, a list of dicts of boxes, labels and scores
    assert prof.tree.output_paths[:3] == ["0.boxes", "0.labels", "0.scores"]


def test_the_shapes_meter_leaves_a_module_argument_alone() -> None:
    class Holder:
        def __init__(self) -> None:
            self.net, self.scale = nn.Linear(2, 2), 3

    class Takes(nn.Module):
        def forward(self, x: torch.Tensor, holder: Holder, layer: nn.Module) -> torch.Tensor:
            return layer(x) * holder.scale

    model = Takes()
    with LayerProf(model, metrics=("shapes",)) as prof:
        model(torch.ones(1, 2), Holder(), nn.Linear(2, 2))
    assert prof.tree.input_shapes == [[1, 2]]  # neither a module's parameters nor an object without tensors


def test_a_detection_training_step_is_bitwise_unchanged_and_fully_timed() -> None:
    model = _faster_rcnn().train()
    state = {name: value.clone() for name, value in model.state_dict().items()}

    def step() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        model.load_state_dict(state)  # BatchNorm's running statistics move each step
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)  # the RPN and the RoI heads sample proposals at random
        losses = model(_images(), _targets())
        sum(losses.values()).backward()
        return losses, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    before = hook_state(model)
    plain_losses, plain_grads = step()
    with LayerProf(model, metrics=("flops", "shapes", "memory")) as prof:
        losses, grads = step()
    assert hook_state(model) == before
    assert list(losses) == ["loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"]
    assert all(torch.equal(losses[key], plain_losses[key]) for key in losses)
    assert grads.keys() == plain_grads.keys() and all(torch.equal(grads[k], plain_grads[k]) for k in grads)
    check_profile(prof, model)
    parameter_modules_have_backward(prof, model)
    assert prof.tree.output_paths == list(losses) and prof.tree.output_shapes == [[], [], [], []]
    # matmul-like work is convolutions and Linears, all trained: backward = 2 x forward, less the input gradient of
    # the first conv (the images need none): 3 -> 16 channels, 3x3, stride 2 on 128x128: 2 * (2*16*64*64) * 27
    first = prof.records["backbone.body.0.0"]
    assert first.flops_forward == 2 * (2 * 16 * 64 * 64) * 27 == first.flops_backward == 7_077_888
    assert prof.tree.flops_backward == 2 * prof.tree.flops_forward - 7_077_888
