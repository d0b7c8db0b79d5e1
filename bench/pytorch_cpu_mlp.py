#!/usr/bin/env python3
"""The PyTorch CPU reference for bench/compare_pytorch.sh: the same MLP as
troupe's examples (784-256-256-10, ReLU, He init), Adam (lr 1e-3) with a
cosine schedule to 5e-5 over all steps, Fashion-MNIST from the same IDX files
normalised by the training set's mean and stddev, the same global batch
(the last, partial batch of an epoch kept, as troupe does), shuffled every
epoch by a seeded generator, test accuracy after every epoch.

  pytorch_cpu_mlp.py [--threads N] [--fused] [--ddp N] [--batch 128]
                     [--epochs 12] [--target 0.89] [--seed 42]

--threads N: torch.set_num_threads(N) (and one inter-op thread).
--fused: torch.optim.Adam(fused=True) (falls back to foreach=True when this
torch cannot run the fused Adam on the CPU; the JSON says so).
--ddp N: N processes (torch.multiprocessing), torch.distributed with gloo on
127.0.0.1, DistributedDataParallel, 1 thread each, the global batch split
evenly; rank 0 evaluates and prints.

Prints ONE JSON line: {"system": "pytorch", "setup", "batch", "epochs",
"samples_per_second" (training steps only), "seconds_to_target" (training
seconds, evaluation excluded, to the end of the first epoch whose test
accuracy >= target; null if never), "epoch_at_target",
"final_test_accuracy", "torch", ...}."""
import os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_cpu_common as common  # loader, options, training loop, DDP, output


def make_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    for m in model:
        if isinstance(m, torch.nn.Linear):  # He (kaiming-normal) init, zero biases
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            torch.nn.init.zeros_(m.bias)
    return model


def main():
    p = common.parser(__doc__, epochs=12, target=0.89)
    a = p.parse_args()
    common.check(p, a)
    common.run(a, common.job(make_model))


if __name__ == "__main__":
    main()
