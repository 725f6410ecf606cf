"""The product packages, in the data flow's order: what the source checks walk (docstrings,
function length, the import layout) and what the wheel and the sources registry ship."""

PACKAGES = ("core", "collector", "store", "planner", "dashboards", "api", "kvscope")
