"""A small CNN with batch normalization and dropout for 1x28x28 images
(Fashion-MNIST), 10 classes. Its BatchNorm running statistics are model
buffers: every update carries them to the master (docs/torchscript.md).

  /usr/bin/python3 tools/cli/export_torchscript.py \\
      docs/examples/models/cnn_bn.py --input_shape 1,28,28 --outputs 10 \\
      --out cnn_bn.pt
"""
import torch
from torch import nn
import torch.nn.functional as F


class ConvNet(nn.Module):
    def __init__(self, channels1: int, channels2: int, dense: int,
                 dropout: float, classes: int):
        super().__init__()
        # 28x28 -> conv (same padding) -> pool -> 14x14 -> conv -> pool -> 7x7.
        self.conv1 = nn.Conv2d(1, channels1, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels1)
        self.conv2 = nn.Conv2d(channels1, channels2, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels2)
        self.fc1 = nn.Linear(channels2 * 7 * 7, dense)
        self.bn3 = nn.BatchNorm1d(dense)
        # nn.Dropout reads self.training, so train()/eval() switch it.
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(dense, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.bn3(self.fc1(torch.flatten(x, 1))))
        return self.out(self.dropout(x))


def get_model(channels1: int = 32, channels2: int = 64, dense: int = 128,
              dropout: float = 0.25, classes: int = 10) -> nn.Module:
    return ConvNet(channels1, channels2, dense, dropout, classes)
