"""A minimal fake Kubernetes API server, enough for `helm template --dry-run=server` to run the
chart's `lookup` calls against it: discovery (/version, /api, /apis and the group versions of
every kind the chart renders), GET of Secrets it holds (with Helm's ownership metadata, so helm
may adopt them), 404 for everything else. Registered as a module by conftest.py."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CORE = [("secrets", "Secret"), ("configmaps", "ConfigMap"), ("services", "Service"), ("pods", "Pod"),
        ("persistentvolumeclaims", "PersistentVolumeClaim"), ("namespaces", "Namespace")]
GROUPS = {("networking.k8s.io", "v1"): [("networkpolicies", "NetworkPolicy")],
          ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget")],
          ("apps", "v1"): [("deployments", "Deployment")],
          ("ray.io", "v1"): [("rayservices", "RayService")],
          ("monitoring.coreos.com", "v1"): [("servicemonitors", "ServiceMonitor")]}


def _resources(pairs):
    return [{"name": r, "singularName": r[:-1], "namespaced": k != "Namespace", "kind": k,
             "verbs": ["get", "list"]} for r, k in pairs]


class FakeKubeApi:
    """secrets: {(namespace, name): {key: plain value}}; `requests` records every GET path."""

    def __init__(self, release: str, secrets: dict[tuple[str, str], dict[str, str]]):
        self.release, self.secrets, self.requests = release, secrets, []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                path = self.path.split("?")[0]
                api.requests.append(path)
                self._send(*api.answer(path))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def answer(self, path: str) -> tuple[int, Any]:
        if path == "/version":
            return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0"}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/api/v1":
            return 200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": _resources(CORE)}
        if path == "/apis":
            groups = []
            for group, version in GROUPS:
                gv = {"groupVersion": f"{group}/{version}", "version": version}
                groups.append({"name": group, "versions": [gv], "preferredVersion": gv})
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        for (group, version), pairs in GROUPS.items():
            if path == f"/apis/{group}/{version}":
                return 200, {"kind": "APIResourceList", "groupVersion": f"{group}/{version}",
                             "resources": _resources(pairs)}
        parts = path.strip("/").split("/")
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
            data = self.secrets.get((parts[3], parts[5]))
            if data is not None:
                return 200, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                             "metadata": {"name": parts[5], "namespace": parts[3],
                                          "labels": {"app.kubernetes.io/managed-by": "Helm"},
                                          "annotations": {"meta.helm.sh/release-name": self.release,
                                                          "meta.helm.sh/release-namespace": parts[3]}},
                             "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}

    def __enter__(self) -> "FakeKubeApi":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
