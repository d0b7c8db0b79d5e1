#!/usr/bin/env python3
"""The PyTorch reference for bench/gpu_training.sh: the same network (--model
mlp: 784-256-256-10, ReLU; --model cnn: examples/fashion_mnist_cnn.json's
convnet), Adam with a cosine schedule (--fused: Adam(fused=True), else
PyTorch's default foreach), Fashion-MNIST from the same IDX files, the same
batch size, on one device. Prints one JSON line: {"system": "pytorch",
"samples_per_second", "test_accuracy", ...}. samples/s counts the training
steps only (as troupe's summary does). PyTorch's defaults stand: cuDNN may
use TF32 tensor cores for convolutions (troupe asks cuDNN for FP32 FMA
math), matrix products stay FP32.

--graph: PyTorch at its fastest on one GPU, as a user who cares writes it:
the data set on the device, the whole step (gather by index, forward, loss,
backward, Adam(fused, capturable) with the learning rate as a device tensor)
captured once in a CUDA graph after 3 warm-up steps and replayed; a
per-epoch randperm on the GPU copied into the graph's index tensor. Full
batches only (the remainder of an epoch is dropped, and not counted).
--compile: torch.compile(mode="max-autotune") of the model, eager steps.
Besides samples/s over all epochs it prints steady_samples_per_second (the
epochs after the first) and first_step_ms (the first step, synchronised)."""
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
    p.add_argument("--graph", action="store_true")
    p.add_argument("--compile", action="store_true")
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
    lr = torch.tensor(1e-3, device=dev) if a.graph else 1e-3
    fused = a.fused or a.graph
    opt = torch.optim.Adam(model.parameters(), lr=lr, **({"fused": True} if fused else {}),
                           **({"capturable": True} if a.graph else {}))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, total, eta_min=5e-5)
    loss_fn = torch.nn.CrossEntropyLoss()
    net = torch.compile(model, mode="max-autotune") if a.compile else model
    model.train()
    if a.graph:
        epoch_seconds, first_ms, samples = graph_epochs(a, net, opt, sched, loss_fn, xtr, ytr,
                                                        steps_per_epoch, sync)
    else:
        epoch_seconds, first_ms, samples = eager_epochs(a, net, opt, sched, loss_fn, xtr, ytr,
                                                        steps_per_epoch, sync, dev)
    train_seconds = sum(epoch_seconds)
    model.eval()
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    name = "pytorch" + (" CUDA graph" if a.graph else " fused Adam" if a.fused else "")
    name += " compiled" if a.compile else ""
    steady = (samples * (a.epochs - 1) / a.epochs / sum(epoch_seconds[1:])
              if a.epochs > 1 else None)
    print(json.dumps({"system": name, "model": a.model,
                      "strategy": "one_device", "gpus": 1,
                      "batch": a.batch, "samples_per_second": round(samples / train_seconds),
                      "steady_samples_per_second": round(steady) if steady else None,
                      "first_step_ms": round(first_ms, 2),
                      "test_accuracy": round(acc, 4), "torch": torch.__version__}))


def eager_epochs(a, net, opt, sched, loss_fn, xtr, ytr, steps_per_epoch, sync, dev):
    seconds, first_ms = [], None
    for _ in range(a.epochs):
        perm = torch.randperm(len(xtr), device=dev)
        sync()
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            i = perm[s * a.batch:(s + 1) * a.batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(xtr[i]), ytr[i])
            loss.backward()
            opt.step()
            sched.step()
            if first_ms is None:
                sync()
                first_ms = (time.perf_counter() - t0) * 1e3
        sync()
        seconds.append(time.perf_counter() - t0)
    return seconds, first_ms, len(xtr) * a.epochs


def graph_epochs(a, net, opt, sched, loss_fn, xtr, ytr, steps_per_epoch, sync):
    full = len(xtr) // a.batch
    idx = torch.zeros(a.batch, dtype=torch.long, device=xtr.device)
    t0 = time.perf_counter()

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(net(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up, as CUDA graph capture needs (these steps train too)
            idx.copy_(torch.randint(len(xtr), (a.batch,), device=xtr.device))
            step()
            sched.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    sync()
    first_ms = (time.perf_counter() - t0) * 1e3
    seconds = []
    for e in range(a.epochs):
        perm = torch.randperm(len(xtr), device=xtr.device)
        sync()
        t0 = time.perf_counter()
        for s in range(full):
            idx.copy_(perm[s * a.batch:(s + 1) * a.batch])
            graph.replay()
            sched.step()
        sync()
        seconds.append(time.perf_counter() - t0)
    return seconds, first_ms, full * a.batch * a.epochs


if __name__ == "__main__":
    main()
