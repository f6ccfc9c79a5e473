#!/usr/bin/python3
"""A PyTorch training loop fed by Sluice: the main job's pipeline file (sharded TFRecords read
interleaved, decoded, resized, flipped, normalized, shuffled, batched) trains a small CNN on the
sample data's 10 classes for a few hundred steps, on the CPU.

    bash scripts/demo.sh                     # builds, and makes build/sample_data once
    PYTHONPATH=build/python python3 resources/examples/train_pytorch.py --steps 300

The batches arrive as torch tensors over the batch's own memory (DLPack, no copy). Each pass over
the pipeline is one epoch; Ctrl-C stops the pipeline and the loop within a second.
"""
import argparse
import os
import time

import torch
from torch import nn

import sluice

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def model(classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--data", default=os.path.join(ROOT, "build", "sample_data", "tfrecord", "*.tfrecord"))
    parser.add_argument("--size", type=int, default=64, help="image side the pipeline resizes to")
    parser.add_argument("--metrics-addr", default="", help="serve /metrics and /stream (sluice-studio --attach)")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # the other cores are the pipeline's
    pipeline = sluice.Pipeline(
        os.path.join(ROOT, "resources", "pipelines", "train_tfrecord.txtpb"),
        set={"files.patterns": args.data, "resize.height": args.size, "resize.width": args.size, "batch.batch_size": 32},
        metrics_addr=args.metrics_addr)
    net = model(10)
    optimiser = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    step, epoch, start = 0, 0, time.perf_counter()
    while step < args.steps:
        correct = seen = 0
        for batch in pipeline.torch():
            images = batch["image"].permute(0, 3, 1, 2)  # NHWC as decoded -> NCHW for the convolutions
            labels = batch["label"]
            logits = net(images)
            loss = loss_fn(logits, labels)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            correct += int((logits.argmax(1) == labels).sum())
            seen += labels.numel()
            step += 1
            if step % 50 == 0:
                print(f"step {step:4d}  loss {loss.item():.3f}  {step * 32 / (time.perf_counter() - start):6.0f} images/s", flush=True)
            if step >= args.steps:
                break
        epoch += 1
        print(f"epoch {epoch}: accuracy on its batches {correct / max(seen, 1):.1%}", flush=True)
    print(pipeline.report())


if __name__ == "__main__":
    main()
