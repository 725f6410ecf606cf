"""The offload decision: none / native / lmcache / both, with reasons and their sources.

- ``evidence``: the Evidence record the rules read (measured, simulated or assumed);
- ``rulestate``: thresholds, votes, reasons, risks; ``rules`` and ``rules_limits``: the rules;
- ``decision``: :func:`decide` runs them; DECIDER.md explains the procedure in prose and
  gives the decision score's formula.
"""

from planner.decide.decision import RULE_IDS, Decision, decide, decider_doc
from planner.decide.evidence import CapacityEvidence, Evidence, ValueCI

__all__ = [
           "RULE_IDS",
           "CapacityEvidence",
           "Decision",
           "Evidence",
           "ValueCI",
           "decide",
           "decider_doc",
]  # fmt: skip
