"""An MLP from 8 inputs to 2 regression targets, for the synthetic
regression data set; train it with "loss": "mse" (or "mae", "huber").

  /usr/bin/python3 tools/cli/export_torchscript.py \\
      docs/examples/models/regression_mlp.py \\
      --input_shape 8 --outputs 2 --out regression_mlp.pt
"""
from collections import OrderedDict
from typing import List

from torch import nn


def get_model(hidden: List[int] = (64, 64), inputs: int = 8,
              outputs: int = 2) -> nn.Module:
    """Per width in `hidden`: Linear + Tanh (smooth, for smooth targets);
    then a linear output layer: no activation, targets are unbounded."""
    layers = []
    width = inputs
    for i, units in enumerate(hidden, start=1):
        layers.append((f"fc{i}", nn.Linear(width, units)))
        layers.append((f"tanh{i}", nn.Tanh()))
        width = units
    layers.append(("out", nn.Linear(width, outputs)))
    return nn.Sequential(OrderedDict(layers))
