#!/usr/bin/env python3
"""The PyTorch reference for bench/gpu_training.sh: the same network (--model
mlp: 784-256-256-10, ReLU; --model cnn: examples/fashion_mnist_cnn.json's
convnet), Adam with a cosine schedule (--fused: Adam(fused=True), else
PyTorch's default foreach), Fashion-MNIST from the same IDX files, the same
batch size, on one device. Prints one JSON line: {"system": "pytorch",
"samples_per_second", "test_accuracy", ...}. samples/s counts the training
steps only (as troupe's summary does). PyTorch's defaults stand: cuDNN may
use TF32 tensor cores for convolutions (troupe asks cuDNN for FP32 FMA
math), matrix products stay FP32."""
import argparse, gzip, json, math, struct, time

import numpy as np
import torch

def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = [struct.unpack(">I", data[4 + 4 * i:8 + 4 * i])[0] for i in range(magic & 0xFF)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--fused", action="store_true")
    a = p.parse_args()
    dev = torch.device(a.device)
    load = lambda n: idx(f"{a.data}/{n}")
    xtr = torch.tensor(load("train-images-idx3-ubyte.gz").reshape(-1, 784), dtype=torch.float32) / 255
    ytr = torch.tensor(load("train-labels-idx1-ubyte.gz"), dtype=torch.long)
    xte = torch.tensor(load("t10k-images-idx3-ubyte.gz").reshape(-1, 784), dtype=torch.float32) / 255
    yte = torch.tensor(load("t10k-labels-idx1-ubyte.gz"), dtype=torch.long)
    # Normalised as troupe's input pipeline does: by the training set's mean and stddev.
    mean, sd = xtr.mean(), xtr.std(unbiased=False)
    xtr, xte = (xtr - mean) / sd, (xte - mean) / sd
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    nn = torch.nn
    if a.model == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 10))
    else:
        xtr, xte = xtr.reshape(-1, 1, 28, 28), xte.reshape(-1, 1, 28, 28)
        model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                              nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Dropout(0.25), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                              nn.Linear(128, 10))
    model = model.to(dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    steps_per_epoch = math.ceil(len(xtr) / a.batch)
    total = steps_per_epoch * a.epochs
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if a.fused else {}))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, total, eta_min=5e-5)
    loss_fn = torch.nn.CrossEntropyLoss()
    train_seconds = 0.0
    model.train()
    for _ in range(a.epochs):
        perm = torch.randperm(len(xtr), device=dev)
        sync()
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            i = perm[s * a.batch:(s + 1) * a.batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xtr[i]), ytr[i])
            loss.backward()
            opt.step()
            sched.step()
        sync()
        train_seconds += time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    print(json.dumps({"system": "pytorch" + (" fused Adam" if a.fused else ""), "model": a.model,
                      "strategy": "one_device", "gpus": 1,
                      "batch": a.batch, "samples_per_second": round(len(xtr) * a.epochs / train_seconds),
                      "test_accuracy": round(acc, 4), "torch": torch.__version__}))

if __name__ == "__main__":
    main()
