#!/usr/bin/env python3
"""Writes data sets in the formats troupe reads besides IDX (data.format).

  fashion_mnist_to_npz.py [SRC] [--out DIR] [--float] [--labels uint8|int64]
                          [--stored] [--limit N]
      Fashion-MNIST's IDX files in SRC (default /usr/share/datasets/fashion-mnist,
      .gz or plain) as DIR/train.npz and DIR/test.npz, each holding x
      ([N, 1, 28, 28] uint8, or float32 scaled to [0, 1] with --float) and y
      ([N] int64, or uint8). Members are deflated (numpy.savez_compressed),
      or stored with --stored (numpy.savez). --limit keeps the first N of each.

  fashion_mnist_to_npz.py --csv [--out DIR] [--rows N] [--seed S]
      A small tabular example: DIR/train.csv and DIR/test.csv of a synthetic
      flower table. It is NOT real measurements: every row is drawn from a
      normal distribution per species, with the per-species means and standard
      deviations of the four measurements of Fisher's iris data, rounded to
      0.1 cm, from a seeded generator (the same files on every run). Columns:
      sepal_length, sepal_width, petal_length, petal_width (cm) and species
      (the label: "setosa", "versicolor", "virginica"). 80% of the rows go to
      train.csv, the rest to test.csv.

Only the Python standard library is used: the .npy bytes are written by hand
(format version 1: magic, header dict padded to 64 bytes, raw little-endian
C-order data) and zipped with zipfile.
"""
import argparse
import array
import csv
import gzip
import os
import random
import struct
import sys
import zipfile

DEFAULT_SRC = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """(dims, bytes) of an unsigned-byte IDX file, plain or gzip."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        sys.exit(f"{path}: not an unsigned-byte IDX file")
    rank = raw[3]
    dims = list(struct.unpack(">" + "I" * rank, raw[4:4 + 4 * rank]))
    data = raw[4 + 4 * rank:]
    count = 1
    for d in dims:
        count *= d
    if len(data) != count:
        sys.exit(f"{path}: {len(data)} bytes of data, the header declares {count}")
    return dims, data


def find(src, base):
    for name in (base + ".gz", base):
        path = os.path.join(src, name)
        if os.path.exists(path):
            return path
    sys.exit(f"{os.path.join(src, base)}(.gz): not found")


def npy_bytes(descr, shape, data):
    """A .npy file (version 1.0) as numpy.save writes it."""
    if len(shape) == 1:
        shape_text = "(%d,)" % shape[0]
    else:
        shape_text = "(" + ", ".join(str(d) for d in shape) + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    # numpy pads with spaces so that the data starts 64-byte aligned.
    total = (10 + len(header) + 1 + 63) // 64 * 64
    header += " " * (total - 10 - len(header) - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("ascii") + data


def little_endian(arr):
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def write_npz(path, members, stored):
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in members:
            z.writestr(name + ".npy", data)


def fashion_mnist(args):
    src = args.src or DEFAULT_SRC
    os.makedirs(args.out, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        dims, pixels = read_idx(find(src, prefix + "-images-idx3-ubyte"))
        ldims, labels = read_idx(find(src, prefix + "-labels-idx1-ubyte"))
        n = dims[0]
        if ldims[0] != n:
            sys.exit(f"{src}: {n} {split} images but {ldims[0]} labels")
        if args.limit:
            n = min(n, args.limit)
        per = 1
        for d in dims[1:]:
            per *= d
        pixels = pixels[: n * per]
        labels = labels[:n]
        shape = [n, 1] + dims[1:]  # channels first
        if args.float:
            x = npy_bytes("<f4", shape, little_endian(array.array("f", (b / 255.0 for b in pixels))))
        else:
            x = npy_bytes("|u1", shape, bytes(pixels))
        if args.labels == "uint8":
            y = npy_bytes("|u1", [n], bytes(labels))
        else:
            y = npy_bytes("<i8", [n], little_endian(array.array("q", list(labels))))
        path = os.path.join(args.out, split + ".npz")
        write_npz(path, [("x", x), ("y", y)], args.stored)
        print(f"{path}: x {shape} {'float32' if args.float else 'uint8'}, y [{n}] {args.labels}")


# Fisher's iris data: per species, the mean and standard deviation of sepal
# length, sepal width, petal length, petal width (cm).
SPECIES = {
    "setosa": [(5.006, 0.352), (3.428, 0.379), (1.462, 0.174), (0.246, 0.105)],
    "versicolor": [(5.936, 0.516), (2.770, 0.314), (4.260, 0.470), (1.326, 0.198)],
    "virginica": [(6.588, 0.636), (2.974, 0.322), (5.552, 0.552), (2.026, 0.275)],
}
COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width", "species"]


def flowers(args):
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    names = sorted(SPECIES)
    rows = []
    for i in range(args.rows):
        species = names[i % len(names)]
        values = [max(0.1, round(rng.gauss(m, s), 1)) for m, s in SPECIES[species]]
        rows.append(["%.1f" % v for v in values] + [species])
    rng.shuffle(rows)
    cut = args.rows * 4 // 5
    for split, part in (("train", rows[:cut]), ("test", rows[cut:])):
        path = os.path.join(args.out, split + ".csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(COLUMNS)
            w.writerows(part)
        print(f"{path}: {len(part)} rows, label column \"species\"")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", nargs="?", help="directory of the Fashion-MNIST IDX files")
    p.add_argument("--out", default=".", help="output directory (default: .)")
    p.add_argument("--float", action="store_true", help="x as float32 in [0, 1] (default uint8)")
    p.add_argument("--labels", choices=["uint8", "int64"], default="int64")
    p.add_argument("--stored", action="store_true", help="store members (default: deflate)")
    p.add_argument("--limit", type=int, default=0, help="keep the first N examples of each split")
    p.add_argument("--csv", action="store_true", help="write the synthetic flower table instead")
    p.add_argument("--rows", type=int, default=150, help="--csv: rows in all (default 150)")
    p.add_argument("--seed", type=int, default=7, help="--csv: generator seed (default 7)")
    args = p.parse_args()
    if args.csv:
        flowers(args)
    else:
        fashion_mnist(args)


if __name__ == "__main__":
    main()
