"""The discrete-event simulator of a vLLM (+ native offload / LMCache) cluster.

It answers what-if questions (`kvscope simulate`, `kvscope advise`) and serves real-named
`/metrics` on machines without GPUs (`kvscope simulate --serve [--loop]`, `kvscope demo`).
Entry points: ``scenario.load_scenario`` / ``parse_scenario``, ``cluster.Simulation``,
``compare`` (modes side by side), ``serve`` (live, optionally looping forever in bounded
memory). It imports only planner.domain and the catalogue.
"""
