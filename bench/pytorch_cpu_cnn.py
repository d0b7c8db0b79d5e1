#!/usr/bin/env python3
"""The PyTorch CPU reference for bench/compare_pytorch.sh --model cnn: the
convnet of troupe's examples/fashion_mnist_cnn.json as an nn.Sequential on
NCHW input [N, 1, 28, 28]: conv2d 1->32 3x3 padding same (bias), batch norm
(momentum 0.1, eps 1e-5), ReLU, 2x2 max pool, conv2d 32->64 3x3 same, batch
norm, ReLU, 2x2 max pool, flatten, dropout 0.25, dense 3136->128, ReLU,
dense 128->10; softmax cross-entropy, Adam (lr 1e-3) with a cosine schedule
to 5e-5 over all steps, Fashion-MNIST from the same IDX files normalised by
the training set's mean and stddev, the same global batch (the last, partial
batch of an epoch kept, as troupe does), shuffled every epoch by a seeded
generator, test accuracy (eval mode: batch norm on its running statistics,
no dropout; in chunks of the batch size) after every epoch.

  pytorch_cpu_cnn.py [--threads N] [--fused] [--channels-last] [--batch 128]
                     [--epochs 8] [--target 0.91] [--seed 42]

Initialisation as troupe's "init": "auto": a conv or dense kernel is He
normal (std sqrt(2 / fan_in), fan_in = C_in * kh * kw) when the next layer
is a ReLU, Glorot uniform (limit sqrt(6 / (fan_in + fan_out))) otherwise;
biases zero, batch norm gamma 1 and beta 0. Here that makes the two convs
(followed by batch norm) and the last dense Glorot, the first dense He.

--threads N: torch.set_num_threads(N) (and one inter-op thread).
--fused: torch.optim.Adam(fused=True) (falls back to foreach=True when this
torch cannot run the fused Adam on the CPU; the JSON says so).
--channels-last: the model and every batch in torch.channels_last (NHWC in
memory), often PyTorch's fastest convolution path on the CPU (oneDNN).

Prints ONE JSON line, as pytorch_cpu_mlp.py: {"system": "pytorch", "setup",
"batch", "epochs", "samples_per_second" (training steps only),
"seconds_to_target" (training seconds, evaluation excluded, to the end of
the first epoch whose test accuracy >= target; null if never),
"epoch_at_target", "final_test_accuracy", "test_accuracy_by_epoch",
"train_seconds", "model": "cnn", "memory_format", "torch", ...}.
The loader, options, training loop and output are pytorch_cpu_common.py's."""
import os, sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_cpu_common as common  # loader, options, training loop, output


def make_model(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32, eps=1e-5, momentum=0.1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64, eps=1e-5, momentum=0.1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.25),
        nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
        nn.Linear(128, 10))
    layers = list(model)
    for k, m in enumerate(layers):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            # troupe's "auto": He before a ReLU, Glorot otherwise (fans as
            # troupe counts them: C * kh * kw; torch's are the same).
            nxt = layers[k + 1] if k + 1 < len(layers) else None
            if isinstance(nxt, nn.ReLU):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            else:
                nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def channels_last(t):
    """The model (its 4-d parameters) or a batch in NHWC memory order."""
    if isinstance(t, nn.Module):
        return t.to(memory_format=torch.channels_last)
    return t.contiguous(memory_format=torch.channels_last)


def main():
    p = common.parser(__doc__, epochs=8, target=0.91, ddp=False)
    p.add_argument("--channels-last", action="store_true",
                   help="model and batches in torch.channels_last memory format")
    a = p.parse_args()
    common.check(p, a)
    j = common.job(make_model, shape=(1, 28, 28), eval_chunk=a.batch,
                   prepare=channels_last if a.channels_last else None)
    fmt = "channels_last" if a.channels_last else "contiguous"
    common.run(a, j, setup_suffix=" + channels_last" if a.channels_last else "",
               extra={"model": "cnn", "memory_format": fmt})


if __name__ == "__main__":
    main()
