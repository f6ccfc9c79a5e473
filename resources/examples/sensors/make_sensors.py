#!/usr/bin/env python3
"""Writes the sample sensor files: one CSV per asset (a machine of a fleet), one row per time step,
three sensor channels, of unequal lengths as real fleets have. Deterministic (no random module:
a fixed linear congruential generator), so the files and the statistics below never change.

Prints the fleet-wide mean and standard deviation of each channel, which
resources/pipelines/preprocess_sensors.txtpb standardizes with."""
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = [120, 80, 150, 60, 100, 90]  # rows per asset
CHANNELS = ["temperature", "pressure", "vibration"]


def noise(state):
    state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
    return state, ((state >> 33) / 2**31) - 0.5


def main():
    state = 12345
    columns = {c: [] for c in CHANNELS}
    for asset, steps in enumerate(STEPS):
        rows = []
        for step in range(steps):
            state, a = noise(state)
            state, b = noise(state)
            state, c = noise(state)
            values = [60 + 4 * asset + 5 * math.sin(step / 9) + 2 * a,
                      101.3 + 0.8 * math.cos(step / 15 + asset) + 0.3 * b,
                      0.02 + 0.01 * abs(math.sin(step / 4)) + 0.005 * c]
            for name, v in zip(CHANNELS, values):
                columns[name].append(v)
            rows.append(f"{asset},{step}," + ",".join(f"{v:.6f}" for v in values))
        with open(os.path.join(HERE, f"asset-{asset:03d}.csv"), "w") as f:
            f.write("asset,step," + ",".join(CHANNELS) + "\n" + "\n".join(rows) + "\n")
    for name in CHANNELS:
        values = [float(f"{v:.6f}") for v in columns[name]]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        print(f"{name}: mean {mean:.6g} std {std:.6g}")


if __name__ == "__main__":
    main()
