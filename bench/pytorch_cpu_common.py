"""What bench/pytorch_cpu_mlp.py and bench/pytorch_cpu_cnn.py share: the
Fashion-MNIST loader (the IDX files, normalised by the training set's mean
and stddev), the command line, the thread and fused-Adam setup, DDP over gloo
and the training loop (Adam lr 1e-3, cosine schedule to 5e-5 over all steps,
the last partial batch of an epoch kept, a seeded shuffle every epoch, test
accuracy after every epoch, not counted in the training time), and the one
JSON line each prints."""
import argparse, json, math, os, socket, sys, time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_mlp import idx  # the IDX reader the GPU reference uses


def load_data(root, shape=(784,)):
    """Training and test images (float32, one example of `shape` each) and
    labels (int64), normalised as troupe's input pipeline does: by the
    training set's mean and stddev."""
    load = lambda n: idx(os.path.join(root, n))
    xtr = torch.tensor(load("train-images-idx3-ubyte.gz").reshape(-1, 784), dtype=torch.float32) / 255
    ytr = torch.tensor(load("train-labels-idx1-ubyte.gz"), dtype=torch.long)
    xte = torch.tensor(load("t10k-images-idx3-ubyte.gz").reshape(-1, 784), dtype=torch.float32) / 255
    yte = torch.tensor(load("t10k-labels-idx1-ubyte.gz"), dtype=torch.long)
    mean, sd = xtr.mean(), xtr.std(unbiased=False)
    xtr, xte = (xtr - mean) / sd, (xte - mean) / sd
    if tuple(shape) != (784,):
        xtr, xte = xtr.reshape(-1, *shape), xte.reshape(-1, *shape)
    return xtr, ytr, xte, yte


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


class job:
    """What differs between the two references: the model (`make_model(seed)`
    seeds torch and returns the initialised network), the shape of one
    example, an optional `prepare(module_or_batch)` (e.g. a memory format,
    applied to the model once and to every batch), and the evaluation chunk
    (None: the whole test set in one forward pass)."""

    def __init__(self, make_model, shape=(784,), prepare=None, eval_chunk=None):
        self.make_model, self.shape, self.prepare, self.eval_chunk = make_model, shape, prepare, eval_chunk


def evaluate(net, xte, yte, j):
    net.eval()  # batch norm on its running statistics, no dropout
    with torch.no_grad():
        if j.eval_chunk is None:
            acc = (net(xte).argmax(1) == yte).float().mean().item()
        else:
            correct = 0
            for k in range(0, len(xte), j.eval_chunk):
                x = xte[k:k + j.eval_chunk]
                if j.prepare:
                    x = j.prepare(x)
                correct += (net(x).argmax(1) == yte[k:k + j.eval_chunk]).sum().item()
            acc = correct / len(xte)
    net.train()
    return acc


def train(a, j, rank, world, result):
    """Trains on rank `rank` of `world` (world 1: no torch.distributed);
    rank 0 fills `result`."""
    xtr, ytr, xte, yte = load_data(a.data, j.shape)
    model = j.make_model(a.seed)
    if j.prepare:
        model = j.prepare(model)
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
            x = xtr[i]
            if j.prepare:
                x = j.prepare(x)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), ytr[i])
            loss.backward()
            opt.step()
            sched.step()
        train_seconds += time.perf_counter() - t0
        if rank == 0:  # evaluation: not counted in the training time
            acc = evaluate(net, xte, yte, j)
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


def ddp_worker(rank, a, j, port, queue):
    set_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=a.ddp)
    try:
        result = {}
        train(a, j, rank, a.ddp, result)
        if rank == 0:
            queue.put(result)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parser(doc, epochs, target, ddp=True):
    """The options both references take (--ddp only where `ddp`)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (single process)")
    p.add_argument("--fused", action="store_true", help="Adam(fused=True), else foreach=True")
    if ddp:
        p.add_argument("--ddp", type=int, default=0, metavar="N", help="N processes, DDP over gloo")
    p.add_argument("--target", type=float, default=target)
    p.add_argument("--seed", type=int, default=42)
    return p


def check(p, a):
    if not hasattr(a, "ddp"):
        a.ddp = 0
    if a.epochs < 1 or a.batch < 1 or a.threads < 1 or a.ddp < 0:
        p.error("--epochs, --batch and --threads must be >= 1, --ddp >= 0")
    if a.ddp > a.batch:
        p.error("--ddp may not exceed --batch")


def run(a, j, setup_suffix="", extra=None):
    """Trains as `a` says (one process on a.threads threads, or a.ddp DDP
    processes) and prints the one JSON line; `setup_suffix` goes on the
    setup's label before the fused-Adam fallback note, `extra` (a dict)
    after the results, before the torch version."""
    adam_label = " + fused Adam" if a.fused else ""
    if a.ddp:
        setup = f"DDP {a.ddp} processes{adam_label}"
        threads = 1
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        mp.spawn(ddp_worker, args=(a, j, free_port(), queue), nprocs=a.ddp, join=True)
        result = queue.get()
    else:
        threads = a.threads
        setup = f"{threads} thread{'s' if threads != 1 else ''}{adam_label}"
        set_threads(threads)
        result = {}
        train(a, j, 0, 1, result)
    setup += setup_suffix
    if result.get("note"):
        setup += " (foreach: fused unsupported)"
    out = {"system": "pytorch", "setup": setup, "batch": a.batch, "epochs": a.epochs,
           "processes": max(a.ddp, 1), "threads_per_process": threads, "target": a.target}
    out.update(result)
    out.update(extra or {})
    out["torch"] = torch.__version__
    print(json.dumps(out), flush=True)
