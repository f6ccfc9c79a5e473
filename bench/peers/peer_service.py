"""The service workload: a dispatcher and workers on this machine (loopback), each system's own
(Sluice's `sluice dispatcher` and `sluice worker`, tf.data's DispatchServer and WorkerServer, each
in a process of its own), and a trainer reading from them in dynamic sharding (Sluice's
"dynamic", tf.data's "distributed_epoch": splits of the file list handed to whichever worker asks):
  1. throughput: the sample images parsed, decoded and resized to 224 (uint8) on the workers,
     batched by 64 in the trainer, one epoch, through one worker and through two;
  2. a worker killed (SIGKILL) once the trainer has 30% of the epoch: the million tiny records
     parsed and batched by 1,024 on two workers; every id the trainer received is counted
     (delivered, twice or more, missing).
run.py runs it through peer_sluice.py and peer_tfdata.py (workload "service"); alone:
  peer_service.py SYSTEM DATA (SYSTEM: sluice, with Debian's Python and PYTHONPATH=BUILD/python;
  tf.data, in the peers environment)"""
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILL_AT = 0.3
TINY_RECORDS = 1_000_000
# tf.data's dispatcher takes a worker it has not heard from for this long as lost (its
# DispatcherConfig.worker_timeout_ms); with its default, the trainer waited for the killed worker
# for more than 10 minutes.
WORKER_TIMEOUT_MS = 2000
STALLED_S = 60


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """The service's processes, ended whatever happens."""

    def __init__(self):
        self.dispatcher, self.workers = None, []

    def kill_worker(self, k):
        self.workers[k].kill()
        self.workers[k].wait()

    def close(self):
        for p in self.workers + [self.dispatcher]:
            if p and p.poll() is None:
                p.kill()
                p.wait()


class SluiceService(Processes):
    def __init__(self, workers):
        super().__init__()
        sluice = os.environ.get("SLUICE", os.path.join(ROOT, "build", "bin", "sluice"))
        self.dispatcher = subprocess.Popen([sluice, "dispatcher", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        address = re.search(r"listening on (\S+)", self.dispatcher.stdout.readline()).group(1)
        self.target = f"grpc://{address}"
        for _ in range(workers):
            self.workers.append(subprocess.Popen([sluice, "worker", "--dispatcher", address, "--port", "0"],
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # Every worker registered before the trainer starts (as with tf.data's, below).
        for _ in range(100):
            listed = subprocess.run([sluice, "service", "workers", "--dispatcher", self.target], capture_output=True, text=True).stdout
            if listed.count(" alive") >= workers:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the Sluice service's {workers} workers did not register: {listed}")


class TfService(Processes):
    def __init__(self, workers):
        super().__init__()
        port = free_port()
        python = sys.executable
        self.dispatcher = subprocess.Popen([python, "-c", "import tensorflow as tf; s = tf.data.experimental.service; "
                                            f"d = s.DispatchServer(s.DispatcherConfig(port={port}, worker_timeout_ms={WORKER_TIMEOUT_MS})); "
                                            "print('up', flush=True); d.join()"],
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.dispatcher.stdout.readline()
        self.target = f"grpc://localhost:{port}"
        for _ in range(workers):
            p = subprocess.Popen([python, "-c", "import tensorflow as tf; s = tf.data.experimental.service; "
                                  f"w = s.WorkerServer(s.WorkerConfig(dispatcher_address='localhost:{port}')); print('up', flush=True); w.join()"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            p.stdout.readline()
            self.workers.append(p)
        time.sleep(1.0)  # their first heartbeat registers them


def sluice_datasets(data, target, job):
    import sluice
    images = (sluice.data.list_files(f"{data}/../sample_data/tfrecord/*.tfrecord", shuffle=False).tfrecord_reader()
              .parse_example(features="image:bytes, label:int64").decode_image().resize(height=224, width=224, mode="crop")
              .distribute(target, processing_mode="dynamic", job_name=f"{job}-images").batch(64))
    tiny = (sluice.data.list_files(f"{data}/tiny/*.tfrecord", shuffle=False).tfrecord_reader()
            .parse_example(features="id:int64, label:int64").batch(1024)
            .distribute(target, processing_mode="dynamic", job_name=f"{job}-tiny"))
    return images, tiny, lambda batch: int(batch["label"].shape[0]), lambda batch: batch["id"]


def tfdata_datasets(data, target, job):
    import tensorflow as tf
    from peer_tfdata import AUTOTUNE, files, parse_and_resize

    def prepare(record):
        img, label = parse_and_resize(record)
        return {"image": tf.cast(tf.round(img), tf.uint8), "label": label}  # 8-bit on the wire, as Sluice's
    service = tf.data.experimental.service
    images = (files(f"{data}/../sample_data/tfrecord/*.tfrecord")
              .interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE).map(prepare, num_parallel_calls=AUTOTUNE)
              .apply(service.distribute("distributed_epoch", target, job_name=f"{job}-images")).batch(64).prefetch(AUTOTUNE))
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
    tiny = (files(f"{data}/tiny/*.tfrecord").interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE)
            .batch(1024).map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=AUTOTUNE)
            .apply(service.distribute("distributed_epoch", target, job_name=f"{job}-tiny")).prefetch(AUTOTUNE))
    return images, tiny, lambda batch: int(batch["label"].shape[0]), lambda batch: batch["id"].numpy()


def run(system, data):
    import numpy as np
    make_service, datasets = {"sluice": (SluiceService, sluice_datasets), "tf.data": (TfService, tfdata_datasets)}[system]
    out = {}
    for workers in (1, 2):
        service = make_service(workers)
        try:
            images, _, count, _ = datasets(data, service.target, f"w{workers}")
            out[f"workers_{workers}"] = measure.consume(lambda: iter(images), count)
        finally:
            service.close()
    service = make_service(2)
    try:
        _, tiny, _, ids_of = datasets(data, service.target, "killed")
        # Read on a thread of its own: a trainer that waits for ever after the kill is reported
        # as such, with what it had received, once nothing has come for STALLED_S.
        batches = queue.Queue()

        def read():
            try:
                for batch in tiny:
                    batches.put(ids_of(batch))
            except Exception as e:  # noqa: BLE001
                batches.put(e)
            batches.put(None)
        threading.Thread(target=read, daemon=True).start()
        received, total, killed_at, start, ended = [], 0, None, time.perf_counter(), "the epoch's end"
        while True:
            try:
                ids = batches.get(timeout=STALLED_S)
            except queue.Empty:
                ended = f"nothing more for {STALLED_S} s after the kill: the trainer waited on"
                break
            if ids is None:
                break
            if isinstance(ids, Exception):
                ended = f"an error: {type(ids).__name__}: {str(ids)[:200]}"
                break
            received.append(ids)
            total += len(ids)
            if killed_at is None and total >= KILL_AT * TINY_RECORDS:
                service.kill_worker(0)
                killed_at = total
        seen = np.bincount(np.concatenate(received), minlength=TINY_RECORDS)
        out["killed"] = {"delivered": total, "expected": TINY_RECORDS, "twice_or_more": int((seen > 1).sum()),
                         "missing": int((seen == 0).sum()), "killed_after": killed_at, "ended": ended,
                         "seconds": time.perf_counter() - start}
    finally:
        service.close()
    return out


def main():
    system, data = sys.argv[1], sys.argv[2]
    name = {"sluice": "Sluice (Python)", "tf.data": "tf.data"}[system]
    measure.report(name, "service", run(system, data))


if __name__ == "__main__":
    main()
