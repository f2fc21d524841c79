"""One job of the demo sweep: throw `samples` darts at the unit square and count those in the circle."""

import argparse
import json
import random

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--samples", type=int, required=True)
args = parser.parse_args()
rng = random.Random(args.seed)
inside = sum(1 for _ in range(args.samples) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)
print(json.dumps({"seed": args.seed, "samples": args.samples, "inside": inside}))
