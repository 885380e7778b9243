#!/usr/bin/python3
"""The learning rates of PyTorch's torch.optim.lr_scheduler, for lr_schedule_test.

Usage: lr_schedule_reference.py SCHEDULE BASE STEPS [NAME=VALUE ...]

Prints one rate per line: the rate an SGD optimizer holds at each position
0 .. STEPS-1, scheduler.step() called after each optimizer step. NAME=VALUE
pairs are the LrScheduleSpec fields (warmup, warmup_start_factor, step_size,
milestones=a,b,c, gamma, t_max, min_lr); a warm-up is a LinearLR joined to
the schedule by SequentialLR. For "plateau" (ReduceLROnPlateau: factor,
patience, threshold, cooldown, min_lr, mode=min|max, values=v1,v2,...) it
prints the rate after each of the values is observed.
"""
import sys

import torch


def main(argv):
    schedule, base, steps = argv[1], float(argv[2]), int(argv[3])
    args = dict(arg.split("=", 1) for arg in argv[4:])
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base)
    sched = torch.optim.lr_scheduler
    if schedule == "plateau":
        plateau = sched.ReduceLROnPlateau(
            optimizer, mode=args.get("mode", "min"), factor=float(args["factor"]),
            patience=int(args["patience"]), threshold=float(args["threshold"]),
            threshold_mode="rel", cooldown=int(args["cooldown"]),
            min_lr=float(args.get("min_lr", 0)))
        for value in args["values"].split(","):
            plateau.step(float(value))
            print(repr(optimizer.param_groups[0]["lr"]))
        return
    if schedule == "step":
        main_schedule = sched.StepLR(optimizer, step_size=int(args["step_size"]),
                                     gamma=float(args["gamma"]))
    elif schedule == "multistep":
        main_schedule = sched.MultiStepLR(
            optimizer, milestones=[int(m) for m in args["milestones"].split(",")],
            gamma=float(args["gamma"]))
    elif schedule == "exponential":
        main_schedule = sched.ExponentialLR(optimizer, gamma=float(args["gamma"]))
    elif schedule == "cosine":
        main_schedule = sched.CosineAnnealingLR(optimizer, T_max=int(args["t_max"]),
                                                eta_min=float(args.get("min_lr", 0)))
    else:
        main_schedule = sched.ConstantLR(optimizer, factor=1.0, total_iters=0)
    warmup = int(args.get("warmup", 0))
    scheduler = main_schedule
    if warmup > 0:
        linear = sched.LinearLR(optimizer, start_factor=float(args["warmup_start_factor"]),
                                end_factor=1.0, total_iters=warmup)
        scheduler = sched.SequentialLR(optimizer, [linear, main_schedule], milestones=[warmup])
    for _ in range(steps):
        print(repr(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()


if __name__ == "__main__":
    main(sys.argv)
