"""Local stand-ins for the web, for tests and benchmarks: many sites on 127.0.1.x
loopback addresses (`SyntheticWeb`) and a forward proxy (`ForwardProxy`). Nothing here
ever contacts a public address."""

from .proxy import ForwardProxy
from .sites import Hit, Route, Site, SyntheticWeb, hang, redirect, respond

__all__ = ["ForwardProxy", "Hit", "Route", "Site", "SyntheticWeb", "hang", "redirect", "respond"]
