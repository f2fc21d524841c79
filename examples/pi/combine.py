"""Combine the demo's results: read every job's estimate.json and print the pooled estimate of pi."""

import json
import math
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "results/pi")
inside = samples = jobs = 0
for line in (root / "jobs.jsonl").read_text().splitlines():
    job = json.loads(line)
    if job["state"] != "done":
        continue
    estimate = json.loads((root / str(job["index"]).zfill(3) / "estimate.json").read_text())
    inside += estimate["inside"]
    samples += estimate["samples"]
    jobs += 1
pi = 4 * inside / samples
print(f"pi is about {pi:.5f} from {samples:,} darts in {jobs} jobs (error {abs(pi - math.pi):.5f})")
