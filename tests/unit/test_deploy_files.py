"""deploy/: the compose file, the Kubernetes manifests and the Dockerfile hold together.

These read the files (no container engine runs here); ``docker compose config`` (or Debian's
``docker-compose``) validates the compose file where one of them is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from memstream.schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
WORKER = ["memstream", "worker"]
SECRETS = {
    "MEMSTREAM_REDACTION_KEY": "0" * 64,
    "POSTGRES_PASSWORD": "test-password",
    "GRAFANA_ADMIN_PASSWORD": "test-password",
}


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def env_of(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def test_compose_runs_every_part_of_the_stack() -> None:
    """NATS (3 nodes), Postgres, a Qdrant server, workers, gateway, Prometheus and Grafana
    are all services; the memstream ones build from the repository's Dockerfile."""
    services = compose()["services"]
    for name in (
        "nats-1",
        "nats-2",
        "nats-3",
        "postgres",
        "qdrant",
        "worker",
        "gateway",
        "prometheus",
        "grafana",
    ):
        assert name in services, name
    for name in ("worker", "gateway", "nats-auth"):
        build = services[name]["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"


def test_compose_streams_match_the_cluster_and_ops_binds_every_interface() -> None:
    """Streams are created at 3 replicas on the 3-node cluster; the worker's ops endpoint
    binds 0.0.0.0 on the port Prometheus scrapes, on every service that runs workers."""
    services = compose()["services"]
    nats_nodes = [n for n in services if re.fullmatch(r"nats-\d", n)]
    worker = env_of(services["worker"])
    assert int(worker["MEMSTREAM_STREAM_REPLICAS"]) == len(nats_nodes) == 3
    assert worker["MEMSTREAM_OPS_HOST"] == "0.0.0.0"
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "memstream"]
    (sd,) = job["dns_sd_configs"]
    workers = [n for n, svc in services.items() if svc.get("command", [])[:2] == WORKER]
    assert workers == ["worker", "worker-extract"]
    assert sd["names"] == workers and str(sd["port"]) == worker["MEMSTREAM_OPS_PORT"]
    for node in nats_nodes:
        assert "--name" in services[node]["command"]


def test_compose_keeps_secrets_out_of_the_file() -> None:
    """Every secret is interpolated from the environment with a required-variable error;
    no literal password or key is written in the file."""
    services = compose()["services"]
    for name, service in services.items():
        for key, value in env_of(service).items():
            if re.search(r"PASSWORD|_KEY$", key):
                assert value.startswith("${") and ":?" in value, (name, key)
    dsn = env_of(services["worker"])["MEMSTREAM_DATABASE_URL"]
    assert "${POSTGRES_PASSWORD:?" in dsn


def test_compose_provisions_the_dashboard_and_the_rules() -> None:
    """Grafana gets the Prometheus data source (the uid the panels name) and the dashboard;
    Prometheus gets the configuration directory with the alert rules."""
    services = compose()["services"]
    grafana = " ".join(services["grafana"]["volumes"])
    assert "./grafana/provisioning:/etc/grafana/provisioning" in grafana
    assert "memstream-dashboard.json" in grafana
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uids = {d["uid"] for d in ds["datasources"]}
    dash = json.loads((DEPLOY / "grafana" / "memstream-dashboard.json").read_text())
    assert {p["datasource"]["uid"] for p in dash["panels"]} <= uids
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]


def test_compose_qdrant_is_new_enough_for_the_client() -> None:
    """The Qdrant server image is at least 1.19 (per-query IDF corpora) and within one minor
    version of the installed qdrant-client (its compatibility check)."""
    from importlib.metadata import version

    image = compose()["services"]["qdrant"]["image"]
    major, minor = map(int, re.search(r":v(\d+)\.(\d+)", image).groups())  # type: ignore[union-attr]
    cmajor, cminor = map(int, version("qdrant-client").split(".")[:2])
    assert (major, minor) >= (1, 19)
    assert major == cmajor and abs(minor - cminor) <= 1


def compose_cli() -> list[str] | None:
    """``docker compose`` (the plugin), else Debian's ``docker-compose``; None if neither."""
    if shutil.which("docker") is not None:
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose") is not None:
        return ["docker-compose"]
    return None


COMPOSE = compose_cli()


@pytest.mark.skipif(
    COMPOSE is None,
    reason="neither docker with the compose plugin nor docker-compose is installed here "
    "(`config` needs no engine, only the client)",
)
def test_docker_compose_config_accepts_the_file_and_requires_the_secrets() -> None:
    """``docker compose config`` parses and interpolates deploy/compose.yaml with the secrets
    in the environment, and refuses it, naming the variable, without them."""
    assert COMPOSE is not None
    command = [*COMPOSE, "-f", str(DEPLOY / "compose.yaml"), "config"]
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    out = subprocess.run(
        command, capture_output=True, text=True, env={**clean, **SECRETS}, check=False
    )
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    assert services["worker"]["environment"]["MEMSTREAM_OPS_HOST"] == "0.0.0.0"
    assert "test-password@postgres" in services["worker"]["environment"]["MEMSTREAM_DATABASE_URL"]
    refused = subprocess.run(command, capture_output=True, text=True, env=clean, check=False)
    assert refused.returncode != 0
    assert "in deploy/.env" in refused.stderr


def test_dockerfile_is_multi_stage_non_root_with_the_model() -> None:
    """Two stages; the runtime runs as a non-root user; the build installs the package (with
    its model files) and fails if the model does not load."""
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2
    assert "COPY --from=build" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert "COPY storage storage" in text and "make_embedder(None, None)" in text
    assert "MEMSTREAM_OPS_HOST=0.0.0.0" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "storage" not in ignored and ".venv" in ignored


def test_kubernetes_deployments_have_probes_resources_and_services() -> None:
    """Every Deployment's containers have readiness and liveness probes on /healthz at a
    declared port, requests and limits; a Service selects each Deployment's pods."""
    docs = manifests()
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    services = [d for d in docs if d["kind"] == "Service"]
    assert {d["metadata"]["name"] for d in deployments} == {
        "memstream-worker",
        "memstream-worker-extract",
        "memstream-gateway",
    }
    for dep in deployments:
        pod = dep["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for c in pod["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            for probe in ("readinessProbe", "livenessProbe"):
                get = c[probe]["httpGet"]
                assert get["path"] == "/healthz" and get["port"] in ports, (dep, probe)
            assert c["resources"]["requests"] and c["resources"]["limits"]
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        selecting = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        assert selecting, dep["metadata"]["name"]
        for svc in selecting:
            targets = {p["targetPort"] for p in svc["spec"]["ports"]}
            assert targets <= set(ports), svc


def test_kubernetes_credentials_come_from_secrets() -> None:
    """NATS credentials are a file mounted from a Secret that MEMSTREAM_NATS_CREDS names;
    the database URL and the redaction key come from a Secret; no secret is inline; the
    worker's ops endpoint binds 0.0.0.0."""
    for dep in (d for d in manifests() if d["kind"] == "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        secret_volumes = {v["name"] for v in spec["volumes"] if "secret" in v}
        for c in spec["containers"]:
            env = {e["name"]: e for e in c["env"]}
            creds = env["MEMSTREAM_NATS_CREDS"]["value"]
            mounts = [m for m in c["volumeMounts"] if m["name"] in secret_volumes]
            assert any(creds.startswith(m["mountPath"] + "/") for m in mounts), creds
            for name, e in env.items():
                if re.search(r"KEY|PASSWORD|DATABASE_URL|TOKEN", name):
                    assert "value" not in e and "secretKeyRef" in e["valueFrom"], name
            if c["name"] == "worker":
                assert env["MEMSTREAM_OPS_HOST"]["value"] == "0.0.0.0"
                assert {"MEMSTREAM_DATABASE_URL", "MEMSTREAM_REDACTION_KEY"} <= set(env)


def test_every_setting_deploy_sets_exists() -> None:
    """The MEMSTREAM_* variables compose and the manifests set are real settings (a typo
    would be ignored silently: Settings ignores unknown variables)."""
    fields = {f"MEMSTREAM_{name.upper()}" for name in Settings.model_fields}
    names = set()
    for service in compose()["services"].values():
        names |= {k for k in env_of(service) if k.startswith("MEMSTREAM_")}
    for dep in (d for d in manifests() if d["kind"] == "Deployment"):
        for c in dep["spec"]["template"]["spec"]["containers"]:
            names |= {e["name"] for e in c["env"]}
    assert names and names <= fields, names - fields
