"""``corral acceptance``: the real-provider acceptance suite (seed 004 V1.1 §5, V1.29,
V1.30, V1.31, V1.42; docs/acceptance.md).

It builds a disposable project and home, starts a supervisor on the provider the
user configured (the packaged local model by default, or any OpenAI-compatible
server), drives real runs through the real CLI, and judges each point from
persisted evidence only: the ledger, the project's files, the logs. Modules:

- ``report``: the verdicts and the JSON report (pydantic);
- ``provider``: which model the suite runs on, or why none is usable (BLOCKED);
- ``workspace``: the disposable project, home and decoy secrets;
- ``specs``: the swarm specs each flow runs;
- ``host``: the supervisors and CLI processes the suite starts (and reaps);
- ``coder_flow``, ``verify_flow``, ``swarm_flow``, ``retry_flow``, ``chat_flow``: the
  runs that produce the evidence (all the I/O), each shared by the points it serves;
- ``oracle``, ``oracle_flows``: the pure judges, evidence to verdict;
- ``consistency`` and ``leak_scan``: ledger invariants and the secret scan;
- ``points``: the points, as one typed tuple, and the suites;
- ``suite``: runs a suite's points and writes the report;
- ``fault_proxy``, ``loopback_http``, ``llama_server``: the loopback fault proxy and
  the OpenAI-compatible route to a local GGUF the retry points need.
"""
