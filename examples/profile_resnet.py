"""Profile one training step of torchvision's ResNet-18 and print where the time goes.

    python examples/profile_resnet.py
"""
from __future__ import annotations

import torch
import torchvision

from layerprof import LayerProf


def main() -> None:
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 224, 224)
    net(x).sum().backward()  # one warm-up step outside the profile: first calls allocate and pick kernels
    net.zero_grad(set_to_none=True)

    with LayerProf(net) as prof:
        net(x).sum().backward()

    print(prof.layerwise_summary(depth=2))
    print()
    print(prof.render_tree(maxdepth=1))


if __name__ == "__main__":
    main()
