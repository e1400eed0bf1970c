#!/usr/bin/python3
"""The torchvision side of the data-loading benchmark: ImageFolder + DataLoader
with the ImageNet training transforms mixtrain's image-folder reader applies
by default (RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)), a
horizontal flip, ToTensor, Normalize), N worker processes, batches of B; prints
images/s over the timed batches, in all and per worker, as one JSON line."""
import json
import sys
import time

USAGE = """usage: scripts/bench_data_torchvision.py DIR [--image-size S] [--batch-size B] [--workers N] [--batches K]
Images/s of torchvision's ImageFolder + DataLoader over DIR/train with the ImageNet training transforms.
  DIR               an ImageFolder: DIR/train/<class>/*.jpg
  --image-size S    crop size (default 224)
  --batch-size B    images a batch (default 64)
  --workers N       DataLoader worker processes (default 1)
  --batches K       timed batches, after 2 untimed ones (default 20)
Prints one JSON line: images_per_s, images_per_s_per_worker, workers, batches, batch_size, image_size.
Needs Debian's python3-torchvision (scripts/setup.sh). Exit 2 on a bad argument."""

PROG = "bench_data_torchvision"


def fail(message):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    opts = {"--image-size": 224, "--batch-size": 64, "--workers": 1, "--batches": 20}
    positional = []
    i = 0
    while i < len(argv):
        if argv[i] in opts:
            if i + 1 >= len(argv) or not argv[i + 1].isdigit() or int(argv[i + 1]) < (0 if argv[i] == "--workers" else 1):
                fail(f"{argv[i]} needs a number (see --help)")
            opts[argv[i]] = int(argv[i + 1])
            i += 2
        elif argv[i].startswith("-"):
            fail(f"unknown flag {argv[i]} (see --help)")
        else:
            positional.append(argv[i])
            i += 1
    if len(positional) != 1:
        fail("expected DIR (see --help)")
    try:
        import torch
        from torchvision import datasets, transforms
    except ImportError as e:
        fail(f"no torchvision ({e}); scripts/setup.sh installs python3-torchvision")
    torch.set_num_threads(1)
    size = opts["--image-size"]
    transform = transforms.Compose([
        transforms.RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    data = datasets.ImageFolder(f"{positional[0]}/train", transform=transform)
    workers, batches, batch = opts["--workers"], opts["--batches"], opts["--batch-size"]
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                         persistent_workers=workers > 0)
    it = iter(loader)
    for _ in range(2):  # untimed: the workers start and fill their queues
        next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(loader)
            x, _ = next(it)
        n += x.shape[0]
    secs = time.perf_counter() - t0
    rate = n / secs
    print(json.dumps({"images_per_s": rate, "images_per_s_per_worker": rate / max(workers, 1), "workers": workers,
                      "batches": batches, "batch_size": batch, "image_size": size}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
