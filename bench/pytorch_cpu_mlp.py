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
import argparse, json, math, os, socket, sys, time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_mlp import idx  # the IDX reader the GPU reference uses


def load_data(root):
    load = lambda n: idx(os.path.join(root, n))
    xtr = torch.tensor(load("train-images-idx3-ubyte.gz").reshape(-1, 784), dtype=torch.float32) / 255
    ytr = torch.tensor(load("train-labels-idx1-ubyte.gz"), dtype=torch.long)
    xte = torch.tensor(load("t10k-images-idx3-ubyte.gz").reshape(-1, 784), dtype=torch.float32) / 255
    yte = torch.tensor(load("t10k-labels-idx1-ubyte.gz"), dtype=torch.long)
    # Normalised as troupe's input pipeline does: by the training set's mean and stddev.
    mean, sd = xtr.mean(), xtr.std(unbiased=False)
    return (xtr - mean) / sd, ytr, (xte - mean) / sd, yte


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


def fused_adam_works():
    """Whether this torch runs Adam(fused=True) on CPU tensors (some versions
    refuse at construction, some at the first step)."""
    try:
        p = torch.nn.Parameter(torch.ones(4))
        opt = torch.optim.Adam([p], lr=1e-3, fused=True)
        p.sum().backward()
        opt.step()
        return True, None
    except Exception as e:  # noqa: BLE001 - any refusal means "not supported"
        return False, f"{type(e).__name__}: {e}".splitlines()[0][:200]


def set_threads(n):
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set, or inter-op work already started: harmless here


def train(a, rank, world, result):
    """Trains on rank `rank` of `world` (world 1: no torch.distributed);
    rank 0 fills `result`."""
    xtr, ytr, xte, yte = load_data(a.data)
    model = make_model(a.seed)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    net = model.module if world > 1 else model
    adam = "default"
    note = None
    kwargs = {}
    if a.fused:
        ok, why = fused_adam_works()
        if ok:
            kwargs["fused"] = True
            adam = "fused"
        else:
            kwargs["foreach"] = True
            adam = "foreach"
            note = f"fused Adam unsupported on the CPU by this torch ({why}); used foreach=True"
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **kwargs)
    n = len(xtr)
    steps_per_epoch = math.ceil(n / a.batch)
    total = steps_per_epoch * a.epochs
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, total, eta_min=5e-5)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(a.seed)  # same permutation on every rank

    train_seconds = 0.0
    seconds_to_target = epoch_at_target = None
    accuracies = []
    for epoch in range(1, a.epochs + 1):
        perm = torch.randperm(n, generator=gen)
        if world > 1:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            i = perm[s * a.batch:(s + 1) * a.batch]
            if world > 1:
                i = i.tensor_split(world)[rank]  # the global batch, split evenly
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xtr[i]), ytr[i])
            loss.backward()
            opt.step()
            sched.step()
        train_seconds += time.perf_counter() - t0
        if rank == 0:  # evaluation: not counted in the training time
            with torch.no_grad():
                acc = (net(xte).argmax(1) == yte).float().mean().item()
            accuracies.append(round(acc, 4))
            if seconds_to_target is None and acc >= a.target:
                seconds_to_target, epoch_at_target = train_seconds, epoch
    if rank == 0:
        result.update({
            "samples_per_second": round(n * a.epochs / train_seconds),
            "seconds_to_target": None if seconds_to_target is None else round(seconds_to_target, 3),
            "epoch_at_target": epoch_at_target,
            "final_test_accuracy": accuracies[-1],
            "train_seconds": round(train_seconds, 3),
            "test_accuracy_by_epoch": accuracies,
            "adam": adam,
        })
        if note:
            result["note"] = note


def ddp_worker(rank, a, port, queue):
    set_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=a.ddp)
    try:
        result = {}
        train(a, rank, a.ddp, result)
        if rank == 0:
            queue.put(result)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (single process)")
    p.add_argument("--fused", action="store_true", help="Adam(fused=True), else foreach=True")
    p.add_argument("--ddp", type=int, default=0, metavar="N", help="N processes, DDP over gloo")
    p.add_argument("--target", type=float, default=0.89)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args()
    if a.epochs < 1 or a.batch < 1 or a.threads < 1 or a.ddp < 0:
        p.error("--epochs, --batch and --threads must be >= 1, --ddp >= 0")
    if a.ddp > a.batch:
        p.error("--ddp may not exceed --batch")

    adam_label = " + fused Adam" if a.fused else ""
    if a.ddp:
        setup = f"DDP {a.ddp} processes{adam_label}"
        threads = 1
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        mp.spawn(ddp_worker, args=(a, free_port(), queue), nprocs=a.ddp, join=True)
        result = queue.get()
    else:
        threads = a.threads
        setup = f"{threads} thread{'s' if threads != 1 else ''}{adam_label}"
        set_threads(threads)
        result = {}
        train(a, 0, 1, result)
    if result.get("note"):
        setup += " (foreach: fused unsupported)"
    out = {"system": "pytorch", "setup": setup, "batch": a.batch, "epochs": a.epochs,
           "processes": max(a.ddp, 1), "threads_per_process": threads, "target": a.target}
    out.update(result)
    out["torch"] = torch.__version__
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
