"""The built-in "mlp" as a get_model file: the same layers, names and
PyTorch default initialization, so a job with
"model": {"torchscript": "mlp.pt"} trains what "model": {"name": "mlp"}
trains.

  /usr/bin/python3 tools/cli/export_torchscript.py docs/examples/models/mlp.py \\
      --input_shape 1,28,28 --outputs 10 --out mlp.pt [--param hidden=[512]]

Parameters are named fc1.weight, fc1.bias, ..., out.weight, out.bias.
"""
from collections import OrderedDict
from typing import List

import torch
from torch import nn


def get_model(hidden: List[int] = (256, 128), inputs: int = 784,
              outputs: int = 10, dropout: float = 0.0) -> nn.Module:
    """Flatten; per width in `hidden`: Linear + ReLU; Dropout(dropout) when
    > 0; Linear to `outputs`. `inputs` is the flattened sample size (784 for
    1x28x28 images)."""
    layers = [("flatten", nn.Flatten())]
    width = inputs
    for i, units in enumerate(hidden, start=1):
        layers.append((f"fc{i}", nn.Linear(width, units)))
        layers.append((f"relu{i}", nn.ReLU()))
        width = units
    if dropout > 0:
        layers.append(("dropout", nn.Dropout(dropout)))
    layers.append(("out", nn.Linear(width, outputs)))
    # A Sequential built from named layers scripts as is; its children's
    # names become the parameter names.
    return nn.Sequential(OrderedDict(layers))
