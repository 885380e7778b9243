"""A GRU over particle sequences in the style of hls4ml's jet taggers: each
sample is [T, F] (T particles, F features each, batch first); the GRU's
output at the last step feeds a dense layer and the class logits.

  /usr/bin/python3 tools/cli/export_torchscript.py \\
      docs/examples/models/gru_jets.py --input_shape 20,6 --outputs 5 \\
      --param features=6 --out gru_jets.pt
"""
import torch
from torch import nn
import torch.nn.functional as F


class GruTagger(nn.Module):
    def __init__(self, features: int, units: int, layers: int, dense: int,
                 dropout: float, classes: int):
        super().__init__()
        # Parameters gru.weight_ih_l0, gru.weight_hh_l0, ... as PyTorch names
        # them. nn.GRU's own dropout (between layers) follows train/eval.
        self.gru = nn.GRU(features, units, num_layers=layers,
                          batch_first=True,
                          dropout=dropout if layers > 1 else 0.0)
        self.fc1 = nn.Linear(units, dense)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(dense, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sequence, _ = self.gru(x)          # [B, T, units]
        last = sequence[:, -1, :]          # the last step, [B, units]
        return self.out(self.dropout(F.relu(self.fc1(last))))


def get_model(features: int = 6, units: int = 64, layers: int = 1,
              dense: int = 64, dropout: float = 0.1,
              classes: int = 5) -> nn.Module:
    return GruTagger(features, units, layers, dense, dropout, classes)
