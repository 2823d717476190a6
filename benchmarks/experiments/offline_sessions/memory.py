"""Resident memory of kiln.load's ways to run a variant, one process per way.

    python benchmarks/experiments/offline_sessions/memory.py ARTIFACT {split,streams,one}

split: kiln.load's default (one single-thread stream per core and a solo model of all cores); streams: the streams
alone (sessions = cores, threads 1); one: one session of all cores. Prints VmRSS (MiB) after loading, after a pass
over the peers' 1,024 held-out texts, and after a call of three texts (the solo model's lone batch).
"""

from __future__ import annotations

import argparse

import kiln
from kiln.data.workloads import held_out_mix
from kiln.system.cpu import cpu_info


def rss_mib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("way", choices=("split", "streams", "one"))
    args = parser.parse_args()
    ways = {"split": {}, "streams": {"sessions": cpu_info().usable_cores, "threads": 1}, "one": {"sessions": 1}}
    predictor = kiln.load(args.artifact, **ways[args.way])
    loaded = rss_mib()
    texts = held_out_mix(1024, predictor.encoder.token_count)
    predictor.predict(texts)
    passed = rss_mib()
    predictor.predict(texts[:3])
    print(f"{args.way}: {loaded} MiB after loading, {passed} after the pass, {rss_mib()} after a lone batch")


if __name__ == "__main__":
    main()
