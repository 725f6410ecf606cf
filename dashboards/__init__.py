"""kvscope dashboards: Grafana dashboards (grafanalib) and Prometheus rules from the catalogue."""
