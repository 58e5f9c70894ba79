"""`crawlq demo`: the nightly ETL of a data team, end to end, on this machine alone.

site.py   the partner sites (sub-domains on 127.0.3.x, login, HTML/CSV/JSON reports)
          and the egress proxy, on a thread of their own, logging every request
etl.py    the ETL, on crawlq's public API: listing, download, parse, normalize, publish
run.py    run_demo: start everything, run the ETL with live progress, check, report
app.py    the ETL over a finished run's data, for `crawlq reprocess` and `crawlq export`
"""

from .run import DEFAULT_OUT, DemoResult, run_demo

__all__ = ["DEFAULT_OUT", "DemoResult", "run_demo"]
