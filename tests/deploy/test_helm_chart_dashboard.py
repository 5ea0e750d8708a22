"""The chart's Grafana dashboard (issue 13): every query uses a metric the code exports (names read
from specdec_metrics/ by their calls), the panels an operator needs, and the ConfigMap that carries
the file with the sidecar's label."""

from __future__ import annotations

import ast
import json
import re

from deploy_helpers import CHART_DIR, REPO_ROOT, strip_source  # registered by conftest.py

DASHBOARD_FILE = CHART_DIR / "dashboards" / "specdec.json"


def exported_metric_names() -> dict[str, str]:
    """Prometheus names of the metrics the code defines, read from the modules of specdec_metrics/:
    `counter|gauge|histogram(NAME, ...)` calls (or Counter/Gauge/Histogram) whose NAME is a string or an
    f-string over module or function
    string constants. Ray exports them with the `ray_` prefix; counters get `_total`, histograms
    `_bucket`, `_sum` and `_count`. Returns {prometheus name: kind}."""
    files = sorted(REPO_ROOT.glob("specdec_metrics/*metrics*.py"))
    assert files, "no metrics module found under specdec_metrics/"
    names: dict[str, str] = {}
    for path in files:
        tree = ast.parse(path.read_text())
        constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}

        def text(node):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value
            if isinstance(node, ast.JoinedStr):
                parts = [text(v.value) if isinstance(v, ast.FormattedValue) else text(v) for v in node.values]
                return None if None in parts else "".join(parts)
            if isinstance(node, ast.Name):
                return constants.get(node.id)  # noqa: B023 (text() is only called within this iteration)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                left, right = text(node.left), text(node.right)
                return None if left is None or right is None else left + right
            return None

        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            func = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
            kind = func.lower()
            if kind not in ("counter", "gauge", "histogram") or not call.args:
                continue
            name = text(call.args[0])
            assert name, f"{path.name}:{call.lineno}: metric name the test cannot read"
            base = f"ray_{name}"
            suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}[kind]
            for suffix in suffixes:
                names[base + suffix] = kind
    return names


def test_metric_names_are_read_from_the_code():
    names = exported_metric_names()
    assert "ray_specdec_spec_decode_num_accepted_tokens_total" in names
    assert "ray_specdec_time_to_first_token_seconds_bucket" in names
    assert "ray_specdec_qps" in names and len(names) >= 15
    # the workers' own (specdec_metrics/worker_metrics.py)
    assert names["ray_specdec_worker_compute_time_seconds_bucket"] == "histogram"
    assert names["ray_specdec_worker_calls_total"] == "counter"
    assert names["ray_specdec_worker_kv_cache_slots_used"] == names["ray_specdec_worker_kv_cache_slots"] == "gauge"


def _dashboard_queries(dashboard) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_every_dashboard_query_should_use_metrics_the_code_exports():
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    exported = exported_metric_names()
    queries = _dashboard_queries(dashboard)
    assert len(queries) >= 10
    for title, expr in queries:
        used = set(re.findall(r"\b(ray_specdec_[A-Za-z0-9_]+)", expr))
        assert used, f"{title}: {expr} queries no specdec metric"
        unknown = used - set(exported)
        assert not unknown, f"panel {title!r} queries {sorted(unknown)}, not exported by the code"
        for name in used:  # histogram_quantile needs buckets; rate() needs counters or histogram parts
            if "histogram_quantile" in expr and "_seconds" in name:
                assert name.endswith("_bucket"), (title, name)


def test_dashboard_should_show_what_an_operator_needs():
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["uid"] and dashboard["templating"]["list"][0]["type"] == "datasource"
    exprs = " ".join(e for _, e in _dashboard_queries(dashboard))
    for needed in ("ray_specdec_qps", "generation_tokens_total", "time_to_first_token_seconds_bucket",
                   "inter_token_latency_seconds_bucket", "num_accepted_tokens_per_pos_total",
                   "num_draft_tokens_per_pos_total", "spec_decode_gamma", "spec_decode_enabled",
                   "request_queue_time_seconds_bucket", "num_requests_waiting", "kv_cache_usage_ratio",
                   # the workers' own: compute time and cache use (draft and target)
                   "ray_specdec_worker_compute_time_seconds_bucket", "ray_specdec_worker_kv_cache_slots_used{",
                   "ray_specdec_worker_kv_cache_slots{", "ray_specdec_worker_calls_total"):
        assert needed in exprs, needed
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Worker compute time", "Worker cache use"} <= titles
    # every query is filtered by the dashboard's model variable (every metric has a model label)
    for title, expr in _dashboard_queries(dashboard):
        for name in re.findall(r"\b(ray_specdec_[A-Za-z0-9_]+)", expr):
            assert re.search(re.escape(name) + r'\{model=~"\$model"', expr), (title, name)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_configmap_should_carry_the_file_and_the_sidecar_label(render):
    cm = strip_source(render().one("ConfigMap", "-dashboard"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["specdec.json"]) == json.loads(DASHBOARD_FILE.read_text())
    other = strip_source(render((), **{"metrics.grafanaDashboard.labels": {"dash": "yes", "grafana_dashboard": None},
                                       "metrics.grafanaDashboard.namespace": "monitoring",
                                       "metrics.grafanaDashboard.annotations": {"grafana_folder": "LLM"}})
                 .one("ConfigMap"))
    assert other["metadata"]["labels"]["dash"] == "yes" and "grafana_dashboard" not in other["metadata"]["labels"]
    assert other["metadata"]["namespace"] == "monitoring"
    assert other["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert not render((), **{"metrics.grafanaDashboard.enabled": False}).of_kind("ConfigMap")
