"""A model of two inputs and two outputs, for the jets data
(tools/data/make_synthetic_data --kind jets): a jet's features [4] and its
tracks [8, 3] in, the jet's kind (3 classes) and its energy (one value) out.

  /usr/bin/python3 tools/cli/export_torchscript.py \\
      docs/examples/models/jets_two_heads.py --input_shape 4 \\
      --input_shape 8,3 --outputs 3,1 --out jets_two_heads.pt

The job names the inputs and outputs in the same order:
"features_datasets": ["jets", "tracks"], "labels_datasets": ["kind",
"energy"], and "outputs": [{"name": "kind", ...}, {"name": "energy", ...}]
(docs/examples/jets_two_heads.json).
"""
from typing import Tuple

import torch
from torch import nn


class JetsTwoHeads(nn.Module):
    """The jet through a dense layer; each track through a shared dense layer,
    then averaged over the tracks (so their order does not matter); both side
    by side through a shared layer; one linear head per output."""

    def __init__(self, jet_features: int, track_features: int, hidden: int,
                 classes: int):
        super().__init__()
        self.jet = nn.Sequential(nn.Linear(jet_features, hidden), nn.ReLU())
        self.track = nn.Sequential(nn.Linear(track_features, hidden),
                                   nn.ReLU())
        self.shared = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(),
                                    nn.Linear(hidden, hidden), nn.ReLU())
        self.kind = nn.Linear(hidden, classes)
        self.energy = nn.Linear(hidden, 1)

    def forward(self, jets: torch.Tensor,
                tracks: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        j = self.jet(jets)
        t = self.track(tracks).mean(dim=1)
        h = self.shared(torch.cat([j, t], dim=1))
        return self.kind(h), self.energy(h)


def get_model(jet_features: int = 4, track_features: int = 3,
              hidden: int = 64, classes: int = 3) -> nn.Module:
    return JetsTwoHeads(jet_features, track_features, hidden, classes)
