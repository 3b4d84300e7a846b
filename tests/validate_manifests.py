"""Validates the container build file, the Helm chart and every manifest in deploy/.

Run through tests/validate-manifests.sh (which provides the virtualenv). Checks, each failing with
a message naming what is wrong:
  1. hadolint on deploy/Dockerfile;
  2. the chart's CRD (helm/aware/crds/) equals the generated one (deploy/crd/);
  3. `helm lint` (the real Helm library, through helm-sdkpy) of the chart with default values and
     with tests/helm/values-full.yaml;
  4. values.schema.json rejects tests/helm/values-bad-*.yaml (lint and install must both fail);
  5. the chart rendered with default values and with values-full.yaml; every rendered document and
     every file of deploy/ validates against the Kubernetes schemas (kubernetes-validate, strict);
     AwareAutoscaler objects validate against the CRD's openAPIV3Schema (jsonschema);
  6. policy checks on every rendered workload (non-root, read-only root filesystem, no
     capabilities, seccomp, probes, resources, scrape annotations, RBAC of the chart);
  7. deploy/manifests/aware.yaml equals a fresh render with default values (staleness);
  8. the chart's alerting rules and Grafana dashboard (helm/aware/files/) equal deploy/prometheus/
     and deploy/grafana/'s, the rendered dashboard ConfigMap carries the dashboard, the
     rendered PrometheusRule carries them and passes `promtool check rules`, and the rendered
     ServiceMonitor selects exactly the services' metrics ports, keeping their `service` label.
     (deploy/prometheus/ holds Prometheus files, not Kubernetes manifests: step 5 skips it.)
  9. helm/README.md's values table names every key of values.yaml and no key it does not have.

helm-sdkpy exposes install but not `helm template`: the chart is rendered by a real Helm install
(HELM_DRIVER=memory) against a minimal in-process fake API server that answers discovery and
accepts every object; the release's manifest is the rendered chart.

`--update` rewrites deploy/manifests/aware.yaml and the chart's CRD and alerting-rules copies
instead of failing.
"""

from __future__ import annotations

import asyncio
import copy
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "aware"
CRD = ROOT / "deploy" / "crd" / "awareautoscalers.aware.dev.yaml"
CHART_CRD = CHART / "crds" / "awareautoscalers.aware.dev.yaml"
ALERTS = ROOT / "deploy" / "prometheus" / "aware-alerts.yaml"
CHART_ALERTS = CHART / "files" / "aware-alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "aware-dashboard.json"
CHART_DASHBOARD = CHART / "files" / "aware-dashboard.json"
MANIFESTS = ROOT / "deploy" / "manifests"
RENDERED = MANIFESTS / "aware.yaml"
VALUES_DIR = ROOT / "tests" / "helm"
RELEASE = "aware"
NAMESPACE = "aware-system"
# Kubernetes versions validated against: the oldest the chart supports that kubernetes-validate
# knows well, and the newest it knows.
K8S_VERSIONS = ["1.33", kubernetes_validate.utils.latest_version()]
SERVICE_COMPONENTS = {
    "controller", "metrics-collector", "recommender", "actuator", "trajectory-recorder",
    "lifecycle-monitor", "meta-learner-trainer",
}
RENDER_HEADER = (
    "# Generated from helm/aware with default values (release `aware`, namespace `aware-system`)\n"
    "# by `bash tests/validate-manifests.sh --update`; do not edit. Apply 00-namespace.yaml first.\n"
)

failures: list[str] = []


def fail(msg: str) -> None:
    failures.append(msg)
    print(f"FAIL: {msg}", flush=True)


def ok(msg: str) -> None:
    print(f"ok:   {msg}", flush=True)


# --- a minimal Kubernetes API server, enough for `helm install` ------------------------------

API_GROUPS = {
    "": {"v1": [("namespaces", "Namespace", False), ("serviceaccounts", "ServiceAccount", True),
                ("services", "Service", True), ("configmaps", "ConfigMap", True),
                ("secrets", "Secret", True), ("persistentvolumeclaims", "PersistentVolumeClaim", True),
                ("pods", "Pod", True), ("events", "Event", True)]},
    "apps": {"v1": [("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True)]},
    "rbac.authorization.k8s.io": {"v1": [("roles", "Role", True), ("rolebindings", "RoleBinding", True),
                                         ("clusterroles", "ClusterRole", False),
                                         ("clusterrolebindings", "ClusterRoleBinding", False)]},
    "policy": {"v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)]},
    "networking.k8s.io": {"v1": [("networkpolicies", "NetworkPolicy", True)]},
    "apiextensions.k8s.io": {"v1": [("customresourcedefinitions", "CustomResourceDefinition", False)]},
    "aware.dev": {"v1alpha1": [("awareautoscalers", "AwareAutoscaler", True)]},
    "monitoring.coreos.com": {"v1": [("servicemonitors", "ServiceMonitor", True),
                                     ("prometheusrules", "PrometheusRule", True)]},
}
RESOURCE_NAMES = {r[0]: r[1] for g in API_GROUPS.values() for v in g.values() for r in v}


class FakeApi(http.server.BaseHTTPRequestHandler):
    store: dict[str, dict] = {}

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_found(self) -> None:
        self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "NotFound", "code": 404, "message": "not found"})

    def do_GET(self):  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        if path == "/version":
            return self._send(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0",
                                    "platform": "linux/amd64"})
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"],
                                    "serverAddressByClientCIDRs": []})
        if path == "/apis":
            groups = []
            for g, versions in API_GROUPS.items():
                if not g:
                    continue
                v = next(iter(versions))
                groups.append({"name": g,
                               "versions": [{"groupVersion": f"{g}/{x}", "version": x} for x in versions],
                               "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}})
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        m = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if m:
            g, v = ("", m.group(1)) if m.group(1) else (m.group(2), m.group(3))
            if v not in API_GROUPS.get(g, {}):
                return self._not_found()
            resources = [{"name": n, "singularName": k.lower(), "namespaced": ns, "kind": k,
                          "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                         for n, k, ns in API_GROUPS[g][v]]
            return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                    "groupVersion": f"{g}/{v}" if g else v, "resources": resources})
        if path in self.store:
            return self._send(200, self.store[path])
        kind = RESOURCE_NAMES.get(path.split("/")[-1])
        if kind:  # a collection
            items = [o for p, o in self.store.items() if p.rsplit("/", 1)[0] == path]
            return self._send(200, {"kind": f"{kind}List", "apiVersion": "v1",
                                    "metadata": {"resourceVersion": "1"}, "items": items})
        return self._not_found()

    def do_POST(self):  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "json" not in (self.headers.get("Content-Type") or ""):
            # Helm's release record (protobuf); never read back with HELM_DRIVER=memory.
            return self._send(201, {"kind": "Secret", "apiVersion": "v1",
                                    "metadata": {"name": "release", "resourceVersion": "1"}})
        obj = json.loads(raw)
        if obj.get("kind") == "CustomResourceDefinition":
            obj["status"] = {"conditions": [{"type": "Established", "status": "True"},
                                            {"type": "NamesAccepted", "status": "True"}],
                             "acceptedNames": obj["spec"]["names"]}
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", "00000000-0000-0000-0000-000000000000")
        meta.setdefault("resourceVersion", "1")
        self.store[f"{path}/{meta.get('name', '')}"] = obj
        self._send(201, obj)

    def do_PATCH(self):  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if path not in self.store:
            return self._not_found()
        self._send(200, self.store[path])

    do_PUT = do_PATCH

    def do_DELETE(self):  # noqa: N802
        self.store.pop(self.path.split("?")[0].rstrip("/"), None)
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


class Helm:
    """Helm (helm-sdkpy) pointed at a fresh fake API server for every render."""

    def __init__(self, workdir: Path):
        os.environ["HELM_DRIVER"] = "memory"
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            os.environ[var] = str(workdir / var.lower())
        import helm_sdkpy  # after HELM_* are set

        self.h = helm_sdkpy
        self.workdir = workdir
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        port = self.server.server_address[1]
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: fake, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: fake, user: {token: fake}}]\n"
            f"contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {NAMESPACE}}}}}]\n"
            "current-context: fake\n")

    def _config(self):
        return self.h.Configuration(namespace=NAMESPACE, kubeconfig=str(self.kubeconfig))

    def render(self, values: dict | None) -> str:
        """The chart's templates rendered by `helm install` (CRDs not included)."""
        FakeApi.store = {}
        result = asyncio.run(self.h.Install(self._config()).run(
            RELEASE, str(CHART), values=values or None, wait=False, timeout=60))
        return result["manifest"]

    def lint(self, values: dict | None) -> list[str]:
        """`helm lint` with these values (a copy of the chart whose values.yaml they replace)."""
        chart = CHART
        if values is not None:
            chart = self.workdir / "lint" / "aware"
            shutil.rmtree(chart.parent, ignore_errors=True)
            shutil.copytree(CHART, chart)
            defaults = yaml.safe_load((CHART / "values.yaml").read_text())
            (chart / "values.yaml").write_text(yaml.safe_dump(merge(defaults, values)))
        try:
            result = asyncio.run(self.h.Lint(self._config()).run(str(chart)))
        except self.h.HelmError as e:
            return [str(e)]
        # helm-sdkpy serializes lint errors as `{}`: the path is kept, the text is not (the same
        # error's text comes from `render`, which runs the same schema and templates).
        problems = [f"error in {m.get('Path')}" + (f": {m['Err']}" if m.get("Err") else "")
                    for m in result.get("Messages") or [] if m.get("Severity", 0) >= 3]
        if not problems and result.get("Errors"):
            problems = [str(e) for e in result["Errors"]]
        return problems


def merge(base, override):
    """Helm-style deep merge of values (maps merge, everything else replaces)."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = copy.deepcopy(base)
        for k, v in override.items():
            out[k] = merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(override)


# --- checks ------------------------------------------------------------------------------------

def docs_of(text: str, origin: str) -> list[tuple[str, dict]]:
    out = []
    for i, d in enumerate(yaml.safe_load_all(text)):
        if d is None:
            continue
        if not isinstance(d, dict):
            fail(f"{origin}: document {i} is not a mapping")
            continue
        out.append((f"{origin}: {d.get('kind')}/{(d.get('metadata') or {}).get('name')}", d))
    return out


def crd_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validate_monitoring(label: str, doc: dict) -> bool:
    """prometheus-operator objects (no schema offline): a PrometheusRule must carry exactly the
    rules of deploy/prometheus/aware-alerts.yaml and pass `promtool check rules`; a ServiceMonitor
    is checked against the Services of its render in check_monitoring."""
    if doc.get("kind") == "ServiceMonitor":
        return True
    if doc.get("kind") != "PrometheusRule":
        fail(f"{label}: unexpected monitoring.coreos.com kind")
        return False
    spec = doc.get("spec") or {}
    groups = spec.get("groups") or []
    file_groups = [g for g in groups if g.get("name") != "aware-release"]
    if {"groups": file_groups} != yaml.safe_load(ALERTS.read_text()):
        fail(f"{label}: groups other than aware-release differ from deploy/prometheus/aware-alerts.yaml")
        return False
    release = [g for g in groups if g.get("name") == "aware-release"]
    if len(release) != 1 or not all(r.get("alert") == "AwarePodsNotScraped" for r in release[0]["rules"]):
        fail(f"{label}: no aware-release group of AwarePodsNotScraped rules")
        return False
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(spec, f)
        f.flush()
        try:
            res = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
        except FileNotFoundError:
            fail(f"{label}: promtool not found (Debian package prometheus)")
            return False
    if res.returncode != 0:
        fail(f"{label}: promtool check rules:\n{res.stdout}{res.stderr}")
        return False
    return True


def check_monitoring(label: str, docs: list[tuple[str, dict]], enabled: bool) -> None:
    """The ServiceMonitor selects exactly the services' Services and scrapes their metrics port
    with honorLabels (each metric's own `service` label would otherwise become exported_service);
    both objects render exactly when enabled."""
    kinds = {}
    for _, d in docs:
        kinds.setdefault(d["kind"], []).append(d)
    monitors, rules = kinds.get("ServiceMonitor", []), kinds.get("PrometheusRule", [])
    dashboards = [c for c in kinds.get("ConfigMap", []) if "aware-dashboard.json" in (c.get("data") or {})]
    if (len(monitors), len(rules), len(dashboards)) != ((1, 1, 1) if enabled else (0, 0, 0)):
        fail(f"{label}: {len(monitors)} ServiceMonitors, {len(rules)} PrometheusRules and "
             f"{len(dashboards)} dashboard ConfigMaps, want {'one each' if enabled else 'none'}")
        return
    if not enabled:
        return
    # One AwarePodsNotScraped rule per running service, counting its Service's scraped pods against
    # the replicas (shards) its workload runs.
    replicas = {d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component"): d["spec"]["replicas"]
                for d in kinds.get("Deployment", []) + kinds.get("StatefulSet", [])}
    services = {s["metadata"]["labels"].get("app.kubernetes.io/component"): s["metadata"]["name"]
                for s in kinds.get("Service", [])}
    want = {c: (services[c], n) for c, n in replicas.items() if c in SERVICE_COMPONENTS and n > 0}
    got = {}
    for g in rules[0]["spec"]["groups"]:
        if g["name"] != "aware-release":
            continue
        for r in g["rules"]:
            m = re.fullmatch(r'\(sum\(up\{namespace="([^"]+)", job="([^"]+)"\}\) or vector\(0\)\) < (\d+)', r["expr"])
            if not m or m.group(1) != NAMESPACE:
                fail(f"{label}: unexpected AwarePodsNotScraped expression {r['expr']!r}")
                continue
            got[r["labels"]["component"]] = (m.group(2), int(m.group(3)))
    if got != want:
        fail(f"{label}: AwarePodsNotScraped rules {got}, want {want} (component: (Service, replicas))")
    elif "recommender" in want:
        # promtool runs the rendered rules: one recommender shard of several down fires for the
        # recommender only, after 5 minutes.
        service, shards = want["recommender"]
        others = [(s, n) for c, (s, n) in want.items() if c != "recommender"]
        series = [{"series": f'up{{namespace="{NAMESPACE}",job="{service}",instance="pod-{i}"}}',
                   "values": "1x20" if i else "1 1 0x18"} for i in range(shards)]
        # Every pod of the other services up (the controller runs several replicas).
        series += [{"series": f'up{{namespace="{NAMESPACE}",job="{s}",instance="pod-{i}"}}', "values": "1x20"}
                   for s, n in others for i in range(n)]
        rule = next(r for g in rules[0]["spec"]["groups"] if g["name"] == "aware-release"
                    for r in g["rules"] if r["labels"]["component"] == "recommender")
        fires = {"exp_labels": {"severity": "critical", "component": "recommender"},
                 "exp_annotations": {k: v.replace("{{ $value }}", str(shards - 1))
                                     for k, v in rule["annotations"].items()}}
        test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "AwarePodsNotScraped", "exp_alerts": []},
                    {"eval_time": "10m", "alertname": "AwarePodsNotScraped", "exp_alerts": [fires]}]}]}
        with tempfile.TemporaryDirectory() as tmp:
            groups = [g for g in rules[0]["spec"]["groups"] if g["name"] == "aware-release"]
            (Path(tmp) / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
            (Path(tmp) / "test.yaml").write_text(yaml.safe_dump(test))
            promtool = shutil.which("promtool") or "/usr/bin/promtool"
            res = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp, capture_output=True, text=True)
        if res.returncode != 0:
            fail(f"{label}: promtool test of AwarePodsNotScraped:\n{res.stdout}{res.stderr}")
    if json.loads(dashboards[0]["data"]["aware-dashboard.json"]) != json.loads(DASHBOARD.read_text()):
        fail(f"{label}: the dashboard ConfigMap differs from deploy/grafana/aware-dashboard.json")
    if (dashboards[0]["metadata"].get("labels") or {}).get("grafana_dashboard") != "1":
        fail(f"{label}: the dashboard ConfigMap lacks the grafana_dashboard label")
    sm = monitors[0]["spec"]
    ep = sm["endpoints"]
    if len(ep) != 1 or ep[0].get("port") != "metrics" or ep[0].get("path") != "/metrics" \
            or ep[0].get("honorLabels") is not True:
        fail(f"{label}: the ServiceMonitor must scrape port `metrics` at /metrics with honorLabels")

    def selects(svc: dict) -> bool:
        labels = svc["metadata"].get("labels") or {}
        sel = sm["selector"]
        if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
            return False
        for e in sel.get("matchExpressions") or []:
            if e["operator"] != "In" or labels.get(e["key"]) not in e["values"]:
                return False
        return True

    selected = {s["metadata"]["labels"].get("app.kubernetes.io/component")
                for s in kinds.get("Service", []) if selects(s)}
    if selected != SERVICE_COMPONENTS:
        fail(f"{label}: the ServiceMonitor selects {sorted(selected)}, want {sorted(SERVICE_COMPONENTS)}")
    for s in kinds.get("Service", []):
        if selects(s) and not any(p.get("name") == "metrics" and p.get("port") == 9464
                                  for p in s["spec"]["ports"]):
            fail(f"{label}: Service {s['metadata']['name']} has no `metrics` port 9464")


def validate_doc(label: str, doc: dict, cr_schema: dict) -> bool:
    if str(doc.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
        return validate_monitoring(label, doc)
    if doc.get("apiVersion") == "aware.dev/v1alpha1" and doc.get("kind") == "AwareAutoscaler":
        errors = sorted(jsonschema.Draft7Validator(cr_schema).iter_errors(doc), key=str)
        # x-kubernetes-* extensions and CEL rules are the API server's; the structure is checked here.
        if errors:
            e = errors[0]
            fail(f"{label}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
            return False
        return True
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            fail(f"{label}: Kubernetes {version}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
            return False
        except kubernetes_validate.SchemaNotFoundError as e:
            fail(f"{label}: {e.message}")
            return False
    return True


NATS_IDENTITY = {"controller": "controller", "metrics-collector": "collector", "actuator": "actuator",
                 "trajectory-recorder": "recorder", "lifecycle-monitor": "lifecycle-monitor",
                 "meta-learner-trainer": "trainer", "recommender": "recommender"}
NATS_IDENTITIES = sorted(set(NATS_IDENTITY.values()) | {"watch"})


def check_nats_identities(docs: list[dict], values: dict) -> None:
    """With nats.auth.enabled: every service runs as its own identity (user, password file from
    its own Secret, inbox prefix), NATS gets every identity's password and the generated
    permissions (files/nats-authorization.conf), and nothing passes credentials in the URL."""
    existing = values["nats"]["auth"].get("existingSecrets", {})
    conf = "".join(d["data"].get("nats.conf", "") for d in docs if d["kind"] == "ConfigMap")
    generated = (ROOT / "helm/aware/files/nats-authorization.conf").read_text()
    if generated.strip() not in conf:
        fail("values-full.yaml: nats.conf does not carry files/nats-authorization.conf")
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    nats = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-nats")]
    nats_env = {e["name"]: e for e in nats[0]["spec"]["template"]["spec"]["containers"][0]["env"]} if nats else {}
    for ident in NATS_IDENTITIES:
        var = "AWARE_NATS_PASSWORD_" + ident.replace("-", "_").upper()
        ref = nats_env.get(var, {}).get("valueFrom", {}).get("secretKeyRef", {})
        want = existing.get(ident)
        if not ref or ref.get("key") != "password" or (want and ref.get("name") != want) \
                or (not want and ref.get("name") not in secrets):
            fail(f"values-full.yaml: NATS does not get the password of `{ident}` ({var}: {ref})")
        if f'user: "{ident}", password: ${var}' not in conf:
            fail(f"values-full.yaml: nats.conf has no user `{ident}`")
    seen = set()
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        component = d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        if component not in NATS_IDENTITY:
            continue
        ident = NATS_IDENTITY[component]
        pod = d["spec"]["template"]["spec"]
        c = pod["containers"][0]
        e = {x["name"]: x.get("value") for x in c["env"]}
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        secret = vols.get("nats-credentials", {}).get("secret", {}).get("secretName")
        mounted = any(m["name"] == "nats-credentials" and m["mountPath"] == "/etc/aware/nats"
                      for m in c.get("volumeMounts", []))
        if e.get("AWARE_BUS__AUTH__USER") != ident or e.get("AWARE_BUS__AUTH__PASSWORD_FILE") != "/etc/aware/nats/password" \
                or e.get("AWARE_BUS__INBOX_PREFIX") != "_INBOX_" + ident.replace("-", "_") \
                or not mounted or secret != existing.get(ident, f"{d['metadata']['name'].rsplit('-' + component, 1)[0]}-nats-{ident}"):
            fail(f"values-full.yaml: {d['metadata']['name']} does not run as NATS identity `{ident}` with its own Secret")
        if "@" in (e.get("AWARE_BUS__URL") or ""):
            fail(f"values-full.yaml: {d['metadata']['name']} passes credentials in AWARE_BUS__URL")
        seen.add(ident)
    if seen != set(NATS_IDENTITY.values()):
        fail(f"values-full.yaml: services with a NATS identity: {sorted(seen)}")
    ok(f"values-full.yaml: {len(seen)} services each run as their own NATS identity")


def check_nats_cluster(label: str, docs: list[dict], replicas: int) -> None:
    """`nats.replicas`: that many servers, one per node, routed to each other (port 6222 open
    between them only); with more than one, every service keeps that many copies of its streams
    and buckets and publishes with acknowledgement. One server: none of it."""
    sts = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-nats")]
    conf = "".join(d["data"].get("nats.conf", "") for d in docs
                   if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-nats"))
    routes = re.findall(r"nats://\S+-nats-(\d+)\.\S+:6222", conf)
    policy = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-nats")]
    route_rule = any(p["port"] == 6222 for d in policy for r in d["spec"].get("ingress", []) for p in r.get("ports", []))
    pod = sts[0]["spec"]["template"]["spec"] if sts else {}
    spread = pod.get("topologySpreadConstraints", [])
    clustered = replicas > 1
    if not sts or sts[0]["spec"]["replicas"] != replicas \
            or sorted(routes) != ([str(i) for i in range(replicas)] if clustered else []) \
            or route_rule != clustered \
            or (clustered and not any(s["topologyKey"] == "kubernetes.io/hostname"
                                      and s["whenUnsatisfiable"] == "DoNotSchedule" for s in spread)):
        fail(f"{label}: NATS is not {replicas} server(s) routed to each other, one per node "
             f"(routes {routes}, 6222 open: {route_rule})")
    want = {"AWARE_BUS__JETSTREAM__REPLICAS": str(replicas), "AWARE_BUS__JETSTREAM__ACK_PUBLISHES": "true",
            "AWARE_MODEL_STORE__REPLICAS": str(replicas)} if clustered else {}
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet") or \
                d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") not in SERVICE_COMPONENTS:
            continue
        e = {x["name"]: x.get("value") for x in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        got = {k: e[k] for k in ("AWARE_BUS__JETSTREAM__REPLICAS", "AWARE_BUS__JETSTREAM__ACK_PUBLISHES",
                                 "AWARE_MODEL_STORE__REPLICAS") if k in e}
        if got != want:
            fail(f"{label}: {d['metadata']['name']} has {got} for a NATS of {replicas} server(s)")
    ok(f"{label}: NATS of {replicas} server(s)")


def check_policies(label: str, docs: list[tuple[str, dict]]) -> None:
    """What the issue asks of every workload and of the RBAC, beyond schema validity."""
    kinds = {}
    for name, d in docs:
        kinds.setdefault(d["kind"], []).append(d)
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = d["spec"]["template"]["spec"]
        pod_sc = spec.get("securityContext") or {}
        component = d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        if not pod_sc.get("runAsNonRoot") or (pod_sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            fail(f"{name}: pod must set runAsNonRoot and seccompProfile RuntimeDefault")
        for c in spec["containers"]:
            sc = c.get("securityContext") or {}
            if not (sc.get("readOnlyRootFilesystem") and sc.get("allowPrivilegeEscalation") is False
                    and (sc.get("capabilities") or {}).get("drop") == ["ALL"]):
                fail(f"{name}/{c['name']}: needs readOnlyRootFilesystem, no privilege escalation, drop ALL")
            r = c.get("resources") or {}
            if not (r.get("requests") and r.get("limits")):
                fail(f"{name}/{c['name']}: needs resource requests and limits")
            if not (c.get("livenessProbe") and c.get("readinessProbe")):
                fail(f"{name}/{c['name']}: needs liveness and readiness probes")
        if component in SERVICE_COMPONENTS:
            ann = d["spec"]["template"]["metadata"].get("annotations") or {}
            want = {"prometheus.io/scrape": "true", "prometheus.io/port": "9464", "prometheus.io/path": "/metrics"}
            if any(ann.get(k) != v for k, v in want.items()):
                fail(f"{name}: scrape annotations {want} missing")
            c = spec["containers"][0]
            if c["livenessProbe"]["httpGet"]["path"] != "/healthz" or c["readinessProbe"]["httpGet"]["path"] != "/readyz":
                fail(f"{name}: probes must be /healthz and /readyz")
            api = component in ("controller", "actuator")
            if bool(spec.get("automountServiceAccountToken")) != api:
                fail(f"{name}: automountServiceAccountToken must be {api}")
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            if not {"/data", "/tmp"} <= mounts:
                fail(f"{name}: /data and /tmp must be volumes (read-only root filesystem)")
    roles = {r["metadata"]["name"]: r for r in kinds.get("ClusterRole", [])}
    # The one namespaced Role: the controller's leader-election Lease, nothing else.
    lease_rule = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]
    for r in kinds.get("Role", []):
        if r["metadata"]["name"] != f"{RELEASE}-controller-leader-election" or r["rules"] != lease_rule:
            fail(f"{label}: unexpected Role {r['metadata']['name']} (only the controller's Lease role, {lease_rule})")
    controllers = [d for d in kinds.get("Deployment", [])
                   if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "controller"]
    for d in controllers:
        env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        election = env.get("AWARE_CONTROLLER__LEADER_ELECTION__MODE", {}).get("value")
        if d["spec"]["replicas"] > 1 and election != "on":
            fail(f"{label}: {d['metadata']['name']} runs {d['spec']['replicas']} replicas without leader election")
        if election == "on":
            if not kinds.get("Role") or not any(b["roleRef"]["name"] == f"{RELEASE}-controller-leader-election"
                                                for b in kinds.get("RoleBinding", [])):
                fail(f"{label}: leader election on but no Role/RoleBinding for the Lease")
            for var, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
                got = env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                if got != field:
                    fail(f"{label}: {d['metadata']['name']}: {var} must come from the downward API ({field})")
    if set(roles) != {f"{RELEASE}-controller", f"{RELEASE}-actuator"}:
        fail(f"{label}: ClusterRoles are {sorted(roles)}, want only the controller's and the actuator's")
    for r in roles.values():
        for rule in r["rules"]:
            if "*" in rule["verbs"] or "*" in rule["resources"] or "*" in rule["apiGroups"]:
                fail(f"{label}: ClusterRole {r['metadata']['name']} has a wildcard rule")
    # Least privilege: exactly the calls each one's code makes (kube_e2e runs them with these).
    for name, want in CLUSTER_ROLE_RULES.items():
        role = roles.get(f"{RELEASE}-{name}")
        got = role and sorted((g, res, sorted(rule["verbs"])) for rule in role["rules"]
                              for g in rule["apiGroups"] for res in rule["resources"])
        if role and got != sorted((g, res, sorted(v)) for (g, res), v in want.items()):
            fail(f"{label}: ClusterRole {RELEASE}-{name} grants {got}, want exactly {want}")
    if not any(p["spec"]["podSelector"] == {} and not p["spec"].get("ingress") and not p["spec"].get("egress")
               and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
               for p in kinds.get("NetworkPolicy", [])):
        fail(f"{label}: no default-deny NetworkPolicy")


# The rules of the two ClusterRoles: (apiGroup, resource) -> verbs, the calls the code makes.
CLUSTER_ROLE_RULES = {
    "controller": {
        ("aware.dev", "awareautoscalers"): ["list", "watch", "patch"],
        ("aware.dev", "awareautoscalers/status"): ["patch"],
        ("apps", "deployments"): ["get"],
        ("events.k8s.io", "events"): ["create", "patch"],
    },
    "actuator": {
        ("apps", "deployments"): ["get", "patch"],
        ("apps", "deployments/scale"): ["patch"],
        ("", "pods"): ["list"],
        ("", "pods/resize"): ["patch"],
    },
}

# The services whose values `<service>.…` rows of helm/README.md's table stand for.
VALUES_SERVICES = ["controller", "collector", "recommender", "actuator", "recorder",
                   "lifecycleMonitor", "trainer"]


def value_paths(values: dict, prefix: str = "") -> list[str]:
    """The dotted paths of every leaf of `values` (a scalar, a list or an empty map)."""
    out = []
    for k, v in values.items():
        path = f"{prefix}.{k}" if prefix else k
        out += value_paths(v, path) if isinstance(v, dict) and v else [path]
    return out


def documented_values(readme: str) -> list[str]:
    """The keys the values table of helm/README.md names: `.x` after `a.b` is `a.x`, a trailing
    `.*` stands for everything below, `<service>.x` for that key of every service."""
    keys = []
    for line in readme.splitlines():
        if not line.startswith("| `"):
            continue
        base = ""
        for key in line.split(" | ")[0].split("`")[1::2]:
            if key.startswith("."):
                key = base + key
            else:
                base = key.rsplit(".", 1)[0] if "." in key else ""
            key = key.removesuffix(".*")
            if key.startswith("<service>."):
                keys += [s + key[len("<service>"):] for s in VALUES_SERVICES]
            else:
                keys.append(key)
    return keys


def check_values_documented(values: dict, readme: str) -> tuple[list[str], list[str]]:
    """(values.yaml keys the table leaves out, table keys values.yaml does not have); a key
    documents everything below it."""
    paths, keys = value_paths(values), documented_values(readme)
    below = lambda p, k: p == k or p.startswith(k + ".")
    missing = [p for p in paths if not any(below(p, k) for k in keys)]
    unknown = [k for k in keys if not any(below(p, k) for p in paths)]
    return missing, unknown


def load_values(name: str) -> dict:
    return yaml.safe_load((VALUES_DIR / name).read_text()) or {}


def main() -> int:
    update = "--update" in sys.argv[1:]
    hadolint = os.environ.get("HADOLINT", "hadolint")
    cr_schema = crd_schema()

    # 1. Dockerfile
    res = subprocess.run([hadolint, "--no-color", str(ROOT / "deploy" / "Dockerfile")], capture_output=True, text=True)
    if res.returncode != 0:
        fail(f"hadolint deploy/Dockerfile:\n{res.stdout}{res.stderr}")
    else:
        ok("hadolint deploy/Dockerfile")

    # 2. The chart's CRD is the generated one.
    if CHART_CRD.read_bytes() != CRD.read_bytes():
        if update:
            shutil.copyfile(CRD, CHART_CRD)
            ok("updated helm/aware/crds/ from deploy/crd/")
        else:
            fail("helm/aware/crds/awareautoscalers.aware.dev.yaml differs from deploy/crd/ "
                 "(run `bash tests/validate-manifests.sh --update`)")
    else:
        ok("helm/aware/crds/ equals deploy/crd/")

    # 8 (first part). The chart's alerting rules and dashboard are deploy/'s.
    for source, copy_ in ((ALERTS, CHART_ALERTS), (DASHBOARD, CHART_DASHBOARD)):
        src, dst = source.relative_to(ROOT), copy_.relative_to(ROOT)
        if not copy_.exists() or copy_.read_bytes() != source.read_bytes():
            if update:
                copy_.parent.mkdir(exist_ok=True)
                shutil.copyfile(source, copy_)
                ok(f"updated {dst} from {src}")
            else:
                fail(f"{dst} differs from {src} (run `bash tests/validate-manifests.sh --update`)")
        else:
            ok(f"{dst} equals {src}")

    # 9. helm/README.md's values table names every value of values.yaml, and only those.
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (ROOT / "helm" / "README.md").read_text()
    missing, unknown = check_values_documented(chart_values, readme)
    if missing or unknown:
        fail(f"helm/README.md values table: values.yaml keys left out {missing}, "
             f"keys values.yaml does not have {unknown}")
    else:
        ok(f"helm/README.md documents all {len(value_paths(chart_values))} values of values.yaml")
    # The check itself notices a key left out and a key that does not exist.
    probe_missing, probe_unknown = check_values_documented(
        {"a": {"b": 1, "c": {"d": 2}}, "e": []},
        "| `a.b`, `.zz` | | |\n| `<service>.x` | | |\n| `e` | | |")
    if probe_missing != ["a.c.d"] or "a.zz" not in probe_unknown or "trainer.x" not in probe_unknown:
        fail(f"the values-table check misreads a table: {probe_missing} {probe_unknown}")

    with tempfile.TemporaryDirectory(prefix="aware-helm-") as tmp:
        helm = Helm(Path(tmp))
        full = load_values("values-full.yaml")

        # 3. helm lint
        for name, values in (("default values", None), ("values-full.yaml", full)):
            problems = helm.lint(values)
            if problems:
                try:
                    helm.render(values)
                    detail = ""
                except helm.h.HelmError as e:
                    detail = f"\n{e}"
                fail(f"helm lint ({name}): " + "; ".join(problems) + detail)
            else:
                ok(f"helm lint ({name})")

        # 4. values.schema.json rejects bad values.
        bad_files = sorted(VALUES_DIR.glob("values-bad-*.yaml"))
        if not bad_files:
            fail("no tests/helm/values-bad-*.yaml")
        for bad in bad_files:
            values = load_values(bad.name)
            lint_problems = helm.lint(values)
            try:
                helm.render(values)
                rendered = True
            except helm.h.HelmError as e:
                rendered = False
                reason = " ".join(line.strip() for line in str(e).splitlines()[-1:]) or type(e).__name__
            if rendered or not lint_problems:
                fail(f"{bad.name}: accepted by the chart (lint {'passed' if not lint_problems else 'failed'}, "
                     f"install {'rendered' if rendered else 'failed'}); values.schema.json must reject it")
            else:
                ok(f"{bad.name} rejected: {reason[:160]}")

        # 5. Render and validate.
        renders = {}
        for name, values in (("default values", None), ("values-full.yaml", full)):
            try:
                renders[name] = helm.render(values)
            except helm.h.HelmError as e:
                fail(f"helm install ({name}) failed: {e}")
                continue
            docs = docs_of(renders[name], f"render({name})")
            valid = sum(validate_doc(label, d, cr_schema) for label, d in docs)
            check_policies(f"render({name})", docs)
            check_monitoring(f"render({name})", docs, enabled=values is not None)
            if values is None:
                check_nats_cluster(f"render({name})", [d for _, d in docs], 1)
            ok(f"render({name}): {valid}/{len(docs)} documents valid for Kubernetes {', '.join(K8S_VERSIONS)}")
        if "values-full.yaml" in renders:
            docs = [d for _, d in docs_of(renders["values-full.yaml"], "full")]
            # Every per-target service is a StatefulSet of `<service>.shards` pods, each told the count.
            for key, component in (("collector", "metrics-collector"), ("recommender", "recommender"),
                                   ("actuator", "actuator"), ("recorder", "trajectory-recorder"),
                                   ("lifecycleMonitor", "lifecycle-monitor"), ("trainer", "meta-learner-trainer")):
                shards = full.get(key, {}).get("shards", 1)
                sts = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith(f"-{component}")]
                env = {e["name"]: e for e in sts[0]["spec"]["template"]["spec"]["containers"][0]["env"]} if sts else {}
                index = env.get("AWARE_SHARD__INDEX", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                if not sts or sts[0]["spec"]["replicas"] != shards \
                        or env.get("AWARE_SHARD__COUNT", {}).get("value") != str(shards) \
                        or index != "metadata.labels['apps.kubernetes.io/pod-index']":
                    fail(f"values-full.yaml: the {component} StatefulSet does not run `{key}.shards` shards")
            check_nats_identities(docs, full)
            check_nats_cluster("values-full.yaml", docs, full["nats"]["replicas"])
            for d in docs:
                if d["kind"] not in ("Deployment", "StatefulSet") or \
                        d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") not in SERVICE_COMPONENTS:
                    continue
                e = {x["name"]: x.get("value") for x in d["spec"]["template"]["spec"]["containers"][0]["env"]}
                if e.get("AWARE_ACTORS__RETIRE_AFTER_SECS") != str(full["retireAfterSeconds"]):
                    fail(f"values-full.yaml: {d['metadata']['name']} does not get retireAfterSeconds")

        # deploy/: manifests, examples, CRD
        files = sorted(p for p in (ROOT / "deploy").rglob("*.y*ml") if p.suffix in (".yaml", ".yml")
                       and "prometheus" not in p.relative_to(ROOT / "deploy").parts)
        total = valid = 0
        for path in files:
            docs = docs_of(path.read_text(), str(path.relative_to(ROOT)))
            total += len(docs)
            valid += sum(validate_doc(label, d, cr_schema) for label, d in docs)
        ok(f"deploy/: {valid}/{total} documents in {len(files)} files valid")

        # Bad AwareAutoscalers the CRD's structural schema must reject (the CEL rules are executed
        # by the Rust test `crd::cel_tests`; bounds against the live Deployment by the controller).
        example = yaml.safe_load((ROOT / "deploy/examples/awareautoscaler.yaml").read_text())
        bad_crs = {
            "objective.alpha 1.5": (["spec", "objective", "alpha"], 1.5),
            "objective.alpha -0.1": (["spec", "objective", "alpha"], -0.1),
            "constraints.minReplicas 0": (["spec", "constraints", "minReplicas"], 0),
            "updatePolicy.updateMode Sometimes": (["spec", "updatePolicy", "updateMode"], "Sometimes"),
            "lifecycle.window 0": (["spec", "lifecycle", "window"], 0),
            "lifecycle.tVar -1": (["spec", "lifecycle", "tVar"], -1.0),
            "fallback.hpa.targetCPUUtilizationPercentage 0":
                (["spec", "fallback", "hpa", "targetCPUUtilizationPercentage"], 0),
            "fallback.hpa.targetCPUUtilizationPercentage 101":
                (["spec", "fallback", "hpa", "targetCPUUtilizationPercentage"], 101),
            "fallback.hpa.targetCPUUtilizationPercentage 0.35":
                (["spec", "fallback", "hpa", "targetCPUUtilizationPercentage"], 0.35),
        }
        rejected = 0
        for what, (path, value) in bad_crs.items():
            doc = json.loads(json.dumps(example))
            node = doc
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
            if list(jsonschema.Draft7Validator(cr_schema).iter_errors(doc)):
                rejected += 1
            else:
                fail(f"the CRD schema accepts an AwareAutoscaler with {what}")
        ok(f"CRD schema rejects {rejected}/{len(bad_crs)} bad AwareAutoscalers")

        # 7. Staleness of deploy/manifests/aware.yaml
        if "default values" in renders:
            fresh = RENDER_HEADER + "---\n" + CHART_CRD.read_text() + renders["default values"].rstrip() + "\n"
            current = RENDERED.read_text() if RENDERED.exists() else ""
            if fresh != current:
                if update:
                    RENDERED.write_text(fresh)
                    ok("updated deploy/manifests/aware.yaml")
                else:
                    fail("deploy/manifests/aware.yaml is stale: it differs from the chart rendered with "
                         "default values (run `bash tests/validate-manifests.sh --update`)")
            else:
                ok("deploy/manifests/aware.yaml equals a fresh render")
        helm.server.shutdown()

    if failures:
        print(f"\nvalidate-manifests: {len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("\nvalidate-manifests: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
