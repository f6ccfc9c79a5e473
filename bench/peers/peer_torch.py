"""The image workload as PyTorch users write it: a Dataset over the same images as JPEG files
(the DataLoader has no TFRecord reader), PIL decoding, torchvision's Resize(224) + CenterCrop(224)
+ ToTensor + Normalize, a DataLoader with 2 worker processes and batches of 64. Debian's Python
with python3-torch and python3-torchvision (SLUICE_BENCH_DEPS=1 bash scripts/install-deps.sh).
Usage: peer_torch.py image DATA EPOCHS"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

try:
    import torch
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from pytorch_loader import Files  # bench_io's DataLoader baseline: the same Dataset
except Exception as e:  # noqa: BLE001
    measure.fail("DataLoader", sys.argv[1], f"{type(e).__name__}: {e} (SLUICE_BENCH_DEPS=1 bash scripts/install-deps.sh)")


def main():
    workload, data, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if workload != "image":
        measure.fail("DataLoader", workload, "only the image workload is written for the DataLoader")
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(Files(sorted(glob.glob(f"{data}/../sample_data/jpeg/*/*.jpg")), flip=False), batch_size=64,
                                         num_workers=2, drop_last=True)

    def batches():
        for _ in range(epochs):
            yield from loader
    measure.report("DataLoader", workload, measure.consume(batches, lambda batch: int(batch[0].shape[0])), version=torch.__version__)


if __name__ == "__main__":
    main()
