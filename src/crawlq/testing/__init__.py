"""Real servers for tests and benchmarks, on loopback addresses only."""
