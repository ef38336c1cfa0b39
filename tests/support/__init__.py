"""Helpers shared by the tests and the benchmarks: ports, promtool, `eventually`, webhook
bodies, and real servers (Prometheus, Alertmanager, the gateway as a process, the Feishu and
phone contract servers, the Kubernetes emulator, a counting HTTP receiver).

Import them as `tests.support.NAME` (the benchmarks run as `python -m bench.NAME` from the
repository root, so the same imports work there).
"""
