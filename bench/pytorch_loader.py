#!/usr/bin/python3
"""The image pipeline of bench_io written the way PyTorch users write it: a Dataset over the same
JPEG files, PIL decoding, torchvision transforms (resize 224 + center crop, random horizontal
flip, to tensor, normalize), a DataLoader with 2 worker processes and batches of 64.
Prints images/s (best of 3 passes after one warm-up pass). Usage: pytorch_loader.py 'GLOB' [WORKERS]
"""
import glob
import sys
import time

import torch
from PIL import Image
from torchvision import transforms


class Files(torch.utils.data.Dataset):
    def __init__(self, paths, flip=True):
        self.paths = paths
        self.transform = transforms.Compose([
            transforms.Resize(224),
            transforms.CenterCrop(224),
            *([transforms.RandomHorizontalFlip()] if flip else []),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ])

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as img:
            return self.transform(img.convert("RGB")), 0


def main():
    paths = sorted(glob.glob(sys.argv[1]))
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(Files(paths), batch_size=64, num_workers=workers, drop_last=False)
    best = None
    for rep in range(4):
        start = time.perf_counter()
        images = sum(batch.shape[0] for batch, _ in loader)
        seconds = time.perf_counter() - start
        if rep > 0:
            best = seconds if best is None else min(best, seconds)
    print(f"pytorch DataLoader ({workers} workers, PIL + torchvision): {images / best:.0f} images/s over {images} images")


if __name__ == "__main__":
    main()
