#!/usr/bin/env python3
"""A loss of one's own for MPI Learn: focal loss (Lin et al., 2017) for
class-index labels, scripted and saved for a job's loss_options.torchscript.

    /usr/bin/python3 docs/examples/losses/focal_loss.py /shared/losses/focal.pt --gamma 2

The module's forward(output, labels) takes the model's output [B, C] and the
batch's labels (int64 class indices [B] here) and returns the batch's mean
loss, a scalar. The job's "loss" still says what the labels are and which
metrics are reported (categorical_crossentropy: accuracy). See
docs/torchscript.md, "A loss of your own".
"""
import argparse

import torch


class FocalLoss(torch.nn.Module):
    def __init__(self, gamma: float):
        super().__init__()
        self.gamma = gamma

    def forward(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(output, dim=1).gather(1, labels.unsqueeze(1)).squeeze(1)
        # Well-classified samples (p near 1) weigh less.
        return (-((1.0 - log_p.exp()) ** self.gamma) * log_p).mean()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="where to write the scripted loss (.pt)")
    parser.add_argument("--gamma", type=float, default=2.0, help="focusing parameter (default 2)")
    args = parser.parse_args()
    scripted = torch.jit.script(FocalLoss(args.gamma))
    # Checked on a batch before it is saved: a scalar, with a gradient.
    output = torch.randn(4, 10, requires_grad=True)
    loss = scripted(output, torch.tensor([0, 3, 9, 1]))
    assert loss.dim() == 0, loss.shape
    loss.backward()
    scripted.save(args.out)
    print(f"wrote {args.out} (focal loss, gamma {args.gamma})")


if __name__ == "__main__":
    main()
