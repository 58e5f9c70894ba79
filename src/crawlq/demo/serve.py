"""The demo's partner sites and proxy in a process of their own, for benchmarks that must
not share a CPU-bound interpreter with the job they measure.

    python -m crawlq.demo.serve --reports 20000 --latency 0.05

Prints one JSON line (sites, resolve map, proxy URL, password), then answers commands read
from stdin, one a line: `log PATH` writes every request logged so far to PATH as JSON lines
and clears the log; `reset` clears it (and which reports already failed once); end of input
stops everything.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from .site import HOSTS, USERNAME, DemoServers, DemoSite


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m crawlq.demo.serve")
    parser.add_argument("--reports", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--errors", type=float, default=0.02)
    options = parser.parse_args()
    site = DemoSite(reports=options.reports, latency=options.latency, errors=options.errors)
    with DemoServers(site) as servers:
        hello = {
            "sites": [servers.base(host) for host in HOSTS],
            "resolve": servers.resolve,
            "proxy": servers.proxy_url,
            "username": USERNAME,
            "password": site.password,
        }
        print(json.dumps(hello), flush=True)
        for line in sys.stdin:
            command, _, argument = line.strip().partition(" ")
            if command == "log":
                hits, site.hits = site.hits, []
                with open(argument, "w", encoding="utf-8") as out:
                    for hit in hits:
                        out.write(json.dumps(asdict(hit)) + "\n")
            elif command == "reset":
                site.hits.clear()
                site.reset_failures()
            print("ok", flush=True)


if __name__ == "__main__":
    main()
