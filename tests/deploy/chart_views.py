"""Views into a rendered chart, shared by the Helm chart tests (the RayService, its groups, pods)."""

from __future__ import annotations

from typing import Any

import yaml

from deploy_helpers import CHART_DIR, CI_VALUES, strip_source

VALUE_SETS = {"default values": (), "ci values": (CI_VALUES,)}
VALUES = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
RAYSERVICE_CRD = "ray.io_rayservices.yaml"
RAYCLUSTER_CRD = "ray.io_rayclusters.yaml"


def rayservice(docs) -> dict[str, Any]:
    return strip_source(docs.one("RayService"))


def cluster(docs) -> dict[str, Any]:
    return rayservice(docs)["spec"]["rayClusterConfig"]


def head(docs) -> dict[str, Any]:
    return cluster(docs)["headGroupSpec"]


def workers(docs) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in cluster(docs).get("workerGroupSpecs", [])}


def container(pod_template: dict[str, Any]) -> dict[str, Any]:
    return pod_template["spec"]["containers"][0]


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def serve_config(docs) -> dict[str, Any]:
    return yaml.safe_load(rayservice(docs)["spec"]["serveConfigV2"])


def ray_pod_templates(docs) -> list[dict[str, Any]]:
    return [head(docs)["template"], *(g["template"] for g in workers(docs).values())]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
