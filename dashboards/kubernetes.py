"""The generated rules and dashboards as Kubernetes objects (deploy/kubernetes/base/generated/).

- kvscope-rules.yaml: one PrometheusRule (Prometheus Operator, monitoring.coreos.com/v1) whose
  groups are exactly those of deploy/prometheus/rules/kvscope-records.yml then -alerts.yml;
- dashboard-<uid>.yaml: one ConfigMap per dashboard, its JSON byte for byte, labelled for the
  Grafana chart's dashboard sidecar (the one kube-prometheus-stack runs);
- kustomization.yaml: lists them (deploy/kubernetes/base includes the directory).
Plain data in, YAML text out (dashboards.rule_files.dump_rules: deterministic, never folded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dashboards.rule_files import dump_rules

__all__ = ["K8S_DIR", "dashboard_configmap", "k8s_files", "prometheus_rule"]

K8S_DIR = Path("deploy/kubernetes/base/generated")
# kube-prometheus-stack selects PrometheusRules and ServiceMonitors labelled with its Helm
# release (`release: <name>`, while prometheus.prometheusSpec.ruleSelectorNilUsesHelmValues is
# true, its default): values.yaml of prometheus-community/helm-charts, kube-prometheus-stack
# (checked at chart 75.x). Another release name: overlay patch (README, "On Kubernetes").
RELEASE_LABEL = {"release": "kube-prometheus-stack"}
# Grafana chart (grafana/helm-charts charts/grafana/values.yaml, sidecar.dashboards at
# 6111227e): the sidecar (kiwigrid/k8s-sidecar) loads ConfigMaps labelled `label: labelValue`
# (kube-prometheus-stack: grafana_dashboard / "1"); `folderAnnotation` names the annotation
# whose value is the sub-folder (with provider.foldersFromFilesStructure: true, the Grafana
# folder). kvscope uses grafana_folder; set folderAnnotation: grafana_folder to honour it.
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
FOLDER_ANNOTATION = "grafana_folder"
FOLDER = "kvscope"
_COMMON = {"app.kubernetes.io/name": "kvscope", "app.kubernetes.io/part-of": "kvscope"}


def prometheus_rule(records: dict[str, Any], alerts: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule holding the recording then the alerting groups, unchanged."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "kvscope-rules", "labels": {**_COMMON, **RELEASE_LABEL}},
        "spec": {"groups": [*records["groups"], *alerts["groups"]]},
    }


def dashboard_configmap(uid: str, text: str) -> dict[str, Any]:
    """One dashboard's ConfigMap: data key ``<uid>.json`` holds the generated file's text."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{uid}-dashboard",
            "labels": {**_COMMON, **DASHBOARD_LABEL},
            "annotations": {FOLDER_ANNOTATION: FOLDER},
        },
        "data": {f"{uid}.json": text},
    }


def k8s_files(
    records: dict[str, Any], alerts: dict[str, Any], dashboards: dict[str, str], header: str
) -> dict[Path, str]:
    """Relative path -> YAML text: the PrometheusRule and one ConfigMap per dashboard."""
    files = {K8S_DIR / "kvscope-rules.yaml": dump_rules(prometheus_rule(records, alerts), header)}
    for uid, text in sorted(dashboards.items()):
        files[K8S_DIR / f"dashboard-{uid}.yaml"] = dump_rules(
            dashboard_configmap(uid, text), header
        )
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [p.name for p in files],
    }
    files[K8S_DIR / "kustomization.yaml"] = dump_rules(kustomization, header)
    return files
