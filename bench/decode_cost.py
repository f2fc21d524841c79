"""What the range checks on the worker protocol's fields cost (issue 12): `Decoder(ExchangeRequest).decode` of
a realistic exchange of 1,000 reports, with the constrained Structs of gridbot.model.records and with the
same Structs unconstrained (as they were), alternated so the machine's drift hits both alike.

    .venv/bin/python bench/decode_cost.py [--runs 15] [--reports 1000]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import msgspec

from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.protocol import ExchangeRequest


class PlainHostInfo(msgspec.Struct, frozen=True):
    host_id: str
    name: str
    platform: str = ""
    ncpus: int = 1
    memory_mb: int = 0
    slots: int = 1
    pool: str = "local"
    prefetch: int = 0
    session: str = ""
    account: str = ""
    speed: float = 0.0


class PlainReport(msgspec.Struct, frozen=True):
    instance_id: int
    outcome: Outcome
    exit_code: int | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    reason: str = ""
    stdout_tail: str = ""
    stderr_tail: str = ""
    outputs: dict[str, bytes] = msgspec.field(default_factory=dict)


class PlainExchange(msgspec.Struct, frozen=True):
    host: PlainHostInfo
    want: int
    running: list[int]
    reports: list[PlainReport] = msgspec.field(default_factory=list)
    fetched: tuple[int, float] = (0, 0.0)


def message(n: int) -> bytes:
    """An exchange of a 64-slot host: `n` reports (one in ten a failure, half with a small output file),
    64 instances still running, and a request for 64 more."""
    reports = [InstanceReport(10_000_000 + i, Outcome.FAILURE if i % 10 == 0 else Outcome.SUCCESS,
                              1 if i % 10 == 0 else 0, 12.5 + i / 1000, 11.75 + i / 1000,
                              "exit code 1" if i % 10 == 0 else "", f"result {i}: 0.{i:06d}\n",
                              "Traceback: error\n" if i % 10 == 0 else "",
                              {"estimate.json": b'{"pi": 3.14159}'} if i % 2 else {}) for i in range(n)]
    host = HostInfo("0123456789abcdef0123", "node17.cluster/worker-3", "Linux-x86_64", 64, 257_000, 64, "slurm", 128)
    return msgspec.msgpack.encode(ExchangeRequest(host, 64, list(range(20_000_000, 20_000_064)), reports))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--reports", type=int, default=1000)
    args = parser.parse_args()
    body = message(args.reports)
    decoders = {"constrained": msgspec.msgpack.Decoder(ExchangeRequest),
                "plain": msgspec.msgpack.Decoder(PlainExchange)}
    if msgspec.to_builtins(decoders["constrained"].decode(body)) != msgspec.to_builtins(decoders["plain"].decode(body)):
        raise SystemExit("the plain copies of the protocol's Structs no longer match gridbot.protocol's: add the "
                         "fields they lack (PlainHostInfo, PlainReport, PlainExchange)")
    number = max(1, 200_000 // args.reports)
    times: dict[str, list[float]] = {k: [] for k in decoders}
    for run in range(args.runs):
        for name in (list(decoders) if run % 2 == 0 else list(reversed(decoders))):
            decode = decoders[name].decode
            times[name].append(timeit.timeit(lambda d=decode: d(body), number=number) / number * 1e6)
    print(f"Decoder(ExchangeRequest).decode, {args.reports:,} reports, {len(body):,} bytes, {args.runs} runs:")
    for name, values in times.items():
        print(f"  {name:<12} min {min(values):8.1f} µs   median {statistics.median(values):8.1f} µs")
    ratio = statistics.median(times["constrained"]) / statistics.median(times["plain"]) - 1
    print(f"  constrained vs plain: {ratio:+.1%} (medians)")


if __name__ == "__main__":
    main()
