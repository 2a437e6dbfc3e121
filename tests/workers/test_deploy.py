"""The deployment files under deploy/: they parse, hang together, and match the code and docs.

No Docker, no Kubernetes cluster, no Prometheus, no network. The Secrets
are not files of deploy/k8s/: they are what deploy/k8s-secrets.sh makes
(run once per module; kubectl, when installed, only renders them
client-side), and a private Redis 7 loads the ACL file it wrote. Settings
are built from the files' variables the way a container reads them (its
environment), with every other ``CTXSTORE_*`` variable of the test run
removed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from arq.connections import RedisSettings
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from support.config import REPO
from support.servers import PrivateRedis, ServerPool, redis7_binary

from ctxstore import ContextStore, Settings
from ctxstore._cli.args import parser as cli_parser
from ctxstore._tenant.acl import POD_USER, WORKER_USER
from ctxstore.metrics import Metrics
from workers import worker_options
from workers.worker import MAX_JOBS

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
NAMESPACE = "ctxstore"
CHECK = ["ctxstore", "worker", "--check"]
SECRETS_SCRIPT = DEPLOY / "k8s-secrets.sh"
DOCS = DEPLOY / "README.md"
TEST_ANTHROPIC_KEY = "sk-ant-test-key"
VARIABLE = re.compile(r"\bCTXSTORE_[A-Z][A-Z0-9_]*")
WORKLOADS = {"Deployment", "StatefulSet"}


def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes document under deploy/k8s/, with its file."""
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        found += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return found


def manifest(kind: str, name: str) -> dict[str, Any]:
    """The one document of this kind and name."""
    matches = [
        doc for _, doc in k8s_documents() if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(matches) == 1, f"{len(matches)} {kind} named {name}"
    return matches[0]


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """The pod template of every workload, by workload name."""
    for _, doc in k8s_documents():
        if doc["kind"] in WORKLOADS:
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def container(workload: str) -> dict[str, Any]:
    """The single container of a workload."""
    spec = dict(pod_specs())[workload]
    (only,) = spec["containers"]
    return dict(only)


def compose() -> dict[str, Any]:
    """deploy/compose.yaml."""
    return dict(yaml.safe_load((DEPLOY / "compose.yaml").read_text()))


@dataclass(frozen=True)
class Generated:
    """What deploy/k8s-secrets.sh wrote.

    Attributes:
        out: Its output directory.
        secrets: Secret name -> key -> value (the files of ``out/<name>/``).
        passwords: User -> password (``creds.json``).
    """

    out: Path
    secrets: dict[str, dict[str, str]]
    passwords: dict[str, str]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """deploy/k8s-secrets.sh, run as the docs say: the ConfigMap's prefix and queue, a tenant."""
    out = tmp_path_factory.mktemp("k8s-secrets") / "out"
    settings = manifest("ConfigMap", "ctxstore-settings")["data"]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CTXSTORE_") and k != "ANTHROPIC_API_KEY"
    }
    env |= {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        "CTXSTORE_KEY_PREFIX": settings["CTXSTORE_KEY_PREFIX"],
        "CTXSTORE_QUEUE_NAME": settings["CTXSTORE_QUEUE_NAME"],
        "ANTHROPIC_API_KEY": TEST_ANTHROPIC_KEY,
    }
    done = subprocess.run(
        [str(SECRETS_SCRIPT), str(out), "--tenant", "acme"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    secrets = {
        directory.name: {path.name: path.read_text() for path in directory.iterdir()}
        for directory in out.iterdir()
        if directory.is_dir()
    }
    return Generated(out, secrets, json.loads((out / "creds.json").read_text()))


def env_sources(workload: str, generated: Generated) -> dict[str, str]:
    """What a workload's container gets from its envFrom ConfigMaps and Secrets."""
    values: dict[str, str] = {}
    for source in container(workload).get("envFrom", []):
        if "configMapRef" in source:
            values |= manifest("ConfigMap", source["configMapRef"]["name"])["data"]
        else:
            values |= generated.secrets[source["secretRef"]["name"]]
    return values


def documented(heading: str) -> dict[str, list[str]]:
    """A table under ``### heading`` of deploy/README.md: first cell -> the names in the second.

    A name followed by ``(optional)`` is given as ``name?``.
    """
    text = DOCS.read_text()
    start = text.index(f"\n### {heading}\n")
    end = text.find("\n#", start + 1)
    rows: dict[str, list[str]] = {}
    for line in text[start : end if end != -1 else None].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        names = [
            name + ("?" if optional else "")
            for name, optional in re.findall(r"`([^`]+)`( \(optional\))?", cells[1])
        ]
        rows[cells[0].strip("`")] = names
    assert rows, f"no table under ### {heading} in {DOCS}"
    return rows


def references() -> Iterator[tuple[str, str, str, str | None]]:
    """Each ConfigMap and Secret a pod of deploy/k8s/ reads: (kind, name, workload, key or None)."""
    for workload, spec in pod_specs():
        for c in [*spec["containers"], *spec.get("initContainers", [])]:
            for source in c.get("envFrom", []):
                if "configMapRef" in source:
                    yield "ConfigMap", source["configMapRef"]["name"], workload, None
                else:
                    yield "Secret", source["secretRef"]["name"], workload, None
            for var in c.get("env", []):
                found = var.get("valueFrom", {})
                for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                    if field in found:
                        yield kind, found[field]["name"], workload, found[field]["key"]
        for volume in spec.get("volumes", []):
            sources = volume.get("projected", {}).get("sources", []) or [volume]
            for source in sources:
                for field, kind, name in (
                    ("configMap", "ConfigMap", "name"),
                    ("secret", "Secret", "secretName"),
                ):
                    ref = source.get(field)
                    if ref is None:
                        continue
                    named = ref.get(name) or ref["name"]
                    items = ref.get("items") or [{"key": None}]
                    for item in items:
                        yield kind, named, workload, item["key"]


def images() -> Iterator[tuple[str, str]]:
    """Every (image, where) of deploy/k8s/'s pods and of Compose's services."""
    for workload, spec in pod_specs():
        for c in [*spec["containers"], *spec.get("initContainers", [])]:
            yield c["image"], workload
    for name, service in compose()["services"].items():
        yield service["image"], f"compose:{name}"


def settings_from(env: dict[str, str | None], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as a container with exactly this CTXSTORE_* environment reads them."""
    for name in [n for n in os.environ if n.startswith("CTXSTORE_") or n == "ANTHROPIC_API_KEY"]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    return Settings()


def job_timeout(settings: Settings) -> float:
    """The longest a job may run on a worker built with these settings (arq's timeout)."""
    options = worker_options(settings)
    (job,) = options["functions"]
    return max(float(job.timeout_s), float(options["job_completion_wait"]))


def duration(text: str) -> float:
    """Seconds in a Compose duration such as ``300s`` or ``4m30s``."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text}"
    return sum(float(n) * units[u] for n, u in parts)


def directives(conf: str) -> dict[str, str]:
    """A redis.conf's directives (comments and blank lines dropped)."""
    found: dict[str, str] = {}
    for line in conf.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            assert name.lower() not in found, f"{name} given twice"
            found[name.lower()] = value.strip()
    return found


def metric_names() -> dict[str, set[str]]:
    """Each metric ctxstore defines -> the series names Prometheus stores for it."""
    registry = CollectorRegistry()
    Metrics(registry)
    names: dict[str, set[str]] = {}
    for family in registry.collect():
        suffixes = {
            "counter": ["_total"],
            "gauge": [""],
            "histogram": ["_bucket", "_count", "_sum"],
        }[family.type]
        names[family.name] = {family.name + suffix for suffix in suffixes}
    return names


METRIC = re.compile(r"\bctxstore_[a-z0-9_]+")


def dockerfile_final_stage() -> list[str]:
    """The instructions of the Dockerfile's last stage, continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    last_from = max(i for i, ln in enumerate(lines) if ln.upper().startswith("FROM "))
    return lines[last_from:]


# Files


def test_every_yaml_file_parses() -> None:
    """Every YAML file under deploy/ parses and holds at least one document."""
    paths = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(paths) >= 5
    for path in paths:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path} is empty"
        assert all(isinstance(d, dict) for d in docs), path


def test_every_k8s_document_is_named_in_the_namespace() -> None:
    """Every Kubernetes document has apiVersion, kind and a name, in the ctxstore namespace."""
    docs = k8s_documents()
    assert {"Namespace", "ConfigMap", "Deployment", "StatefulSet"} <= {d["kind"] for _, d in docs}
    for path, doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), path
        assert doc["metadata"]["name"], path
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == NAMESPACE
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, (path, doc["metadata"])


def test_selectors_match_their_pods() -> None:
    """Every workload, Service and PodDisruptionBudget selects pods that a workload creates."""
    pod_labels = [
        doc["spec"]["template"]["metadata"]["labels"]
        for _, doc in k8s_documents()
        if doc["kind"] in WORKLOADS
    ]
    assert pod_labels
    for path, doc in k8s_documents():
        if doc["kind"] in WORKLOADS:
            selector = doc["spec"]["selector"]["matchLabels"]
            assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items(), path
        elif doc["kind"] in {"Service", "PodDisruptionBudget"}:
            selector = doc["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            assert any(selector.items() <= lbl.items() for lbl in pod_labels), (path, selector)


def test_deploy_k8s_holds_no_secret() -> None:
    """No Secret under deploy/k8s/: applying it never replaces the generated users or URLs."""
    kinds = [doc["kind"] for _, doc in k8s_documents()]
    assert "StatefulSet" in kinds and "Secret" not in kinds
    assert "CHANGE-ME" not in "".join(p.read_text() for p in K8S.rglob("*.yaml"))


def test_every_secret_configmap_and_image_is_defined_or_documented() -> None:
    """Each ConfigMap a pod reads is defined (with the key); each Secret and image is documented."""
    secrets = documented("Secrets")
    configmaps = documented("ConfigMaps")
    listed_images = documented("Images")
    seen = 0
    for kind, name, workload, key in references():
        seen += 1
        if kind == "ConfigMap":
            assert name in configmaps, (workload, name)
            data = manifest("ConfigMap", name)["data"]
            assert key is None or key in data, (workload, name, key)
        else:
            assert name in secrets, (workload, name)
            keys = {k.rstrip("?") for k in secrets[name]}
            assert key is None or key in keys, (workload, name, key)
            assert key is None or f"{key}?" not in secrets[name], "a key read by name is optional"
    assert seen >= 7  # the worker's, Redis's and the example agent's
    for name in configmaps:
        manifest("ConfigMap", name)  # a documented ConfigMap is defined, once
    used = dict(images())
    assert len(used) >= 4
    for image, where in used.items():
        assert image in listed_images, f"{image} ({where}) is not in deploy/README.md's images"


def test_the_script_makes_exactly_the_documented_secrets(generated: Generated) -> None:
    """k8s-secrets.sh writes the docs' Secrets with their keys (an optional one when it is set)."""
    assert os.access(SECRETS_SCRIPT, os.X_OK), "the docs run it as deploy/k8s-secrets.sh"
    expected = {
        name: {key.rstrip("?") for key in keys} for name, keys in documented("Secrets").items()
    }
    assert {name: set(values) for name, values in generated.secrets.items()} == expected
    assert generated.secrets["ctxstore-worker"]["ANTHROPIC_API_KEY"] == TEST_ANTHROPIC_KEY
    for path in generated.out.rglob("*"):
        assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (client only)")
def test_the_script_renders_the_secrets_for_kubectl_apply(generated: Generated) -> None:
    """secrets.yaml holds the three Secrets in the ctxstore namespace, with the files' values."""
    docs = [
        d for d in yaml.safe_load_all((generated.out / "secrets.yaml").read_text()) if d is not None
    ]
    assert [(d["kind"], d["metadata"]["namespace"]) for d in docs] == [("Secret", NAMESPACE)] * 3
    rendered = {
        d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()}
        for d in docs
    }
    assert rendered == generated.secrets


def test_every_pod_runs_non_root_on_a_read_only_root() -> None:
    """Every pod runs as a non-root user, on a read-only root fs, without privilege escalation."""
    for workload, spec in pod_specs():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, workload
        assert pod.get("runAsUser", 1) != 0, workload
        assert spec.get("automountServiceAccountToken") is False, workload
        for c in spec["containers"]:
            ctx = c["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True, workload
            assert ctx["allowPrivilegeEscalation"] is False, workload
            assert ctx["capabilities"]["drop"] == ["ALL"], workload
            assert c["resources"]["limits"]["memory"], workload


# The worker


def test_worker_probes_run_the_health_check() -> None:
    """The worker's startup, readiness and liveness probes run `ctxstore worker --check`."""
    worker = container("ctxstore-worker")
    assert worker["args"][0] == "worker"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert worker[probe]["exec"]["command"] == CHECK, probe
        # A probe starts a Python process: about a second; the default timeout is 1 s.
        assert worker[probe]["timeoutSeconds"] >= 5, probe


def test_worker_grace_period_covers_the_job_timeout(
    generated: Generated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's termination grace period is at least the longest a job may run."""
    spec = dict(pod_specs())["ctxstore-worker"]
    defaults = settings_from({"CTXSTORE_REDIS_URL": "redis://r:6379/0"}, monkeypatch)
    assert job_timeout(defaults) == defaults.summary_timeout * 4 + 30
    configured = settings_from(dict(env_sources("ctxstore-worker", generated)), monkeypatch)
    needed = max(job_timeout(defaults), job_timeout(configured))
    assert spec["terminationGracePeriodSeconds"] >= needed
    assert "lifecycle" not in container("ctxstore-worker"), "SIGTERM alone drains a worker"


def test_worker_name_is_the_pod_name() -> None:
    """CTXSTORE_WORKER_NAME comes from the pod's name, so each pod checks its own key."""
    env = {v["name"]: v for v in container("ctxstore-worker")["env"]}
    ref = env["CTXSTORE_WORKER_NAME"]["valueFrom"]["fieldRef"]
    assert ref["fieldPath"] == "metadata.name"


def test_worker_requests_and_limits_resources() -> None:
    """The worker sets CPU and memory requests and limits, requests within limits."""
    resources = container("ctxstore-worker")["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert {"cpu", "memory"} <= resources["limits"].keys()
    mebibytes = {k: int(v.removesuffix("Mi")) for k, v in resources["limits"].items() if "Mi" in v}
    assert int(resources["requests"]["memory"].removesuffix("Mi")) <= mebibytes["memory"]


def test_worker_disruption_budget_lets_drains_through() -> None:
    """The workers' PodDisruptionBudget allows one eviction at a time, even at one replica."""
    budget = manifest("PodDisruptionBudget", "ctxstore-worker")["spec"]
    assert budget.get("maxUnavailable") == 1 and "minAvailable" not in budget


# Settings named in the files


def test_every_ctxstore_variable_is_a_setting() -> None:
    """Every CTXSTORE_* name under deploy/ and in the README is a Settings field."""
    fields = set(Settings.model_fields)
    names: dict[str, set[str]] = {}
    for path in [REPO / "README.md", *sorted(p for p in DEPLOY.rglob("*") if p.is_file())]:
        for name in VARIABLE.findall(path.read_text()):
            names.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert len(names) >= 10
    unknown = {n: w for n, w in names.items() if n.removeprefix("CTXSTORE_").lower() not in fields}
    assert not unknown, unknown


@pytest.mark.parametrize(
    ("workload", "user"),
    [
        ("ctxstore-worker", WORKER_USER),
        ("example-agent", POD_USER),
    ],
)
def test_pod_environment_parses_into_settings(
    workload: str, user: str, generated: Generated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's ConfigMap and generated Secret values all land in Settings, as its ACL user."""
    c = container(workload)
    env: dict[str, str | None] = dict(env_sources(workload, generated))
    for var in c.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            env[var["name"]] = generated.secrets[ref["name"]][ref["key"]]
        elif "value" in var:
            env[var["name"]] = var["value"]
    for name in env:
        assert name.startswith("CTXSTORE_") or name == "ANTHROPIC_API_KEY", (workload, name)
    settings = settings_from(env, monkeypatch)
    fields = {n.removeprefix("CTXSTORE_").lower() for n in env}
    assert fields <= settings.model_fields_set, fields - settings.model_fields_set
    urls = [u for u in (settings.redis_url, settings.queue_url) if u is not None]
    assert urls
    for url in urls:
        parsed = RedisSettings.from_dsn(url)
        assert parsed.username == user, (workload, url)
        assert parsed.password == generated.passwords[user], workload


def test_secret_urls_name_the_redis_service(generated: Generated) -> None:
    """The generated URLs name the Redis StatefulSet's pod, through its headless Service."""
    statefulset = manifest("StatefulSet", "ctxstore-redis")
    service = manifest("Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    host = f"{statefulset['metadata']['name']}-0.{service['metadata']['name']}.{NAMESPACE}"
    urls = [
        value
        for values in generated.secrets.values()
        for key, value in values.items()
        if key.startswith("CTXSTORE_") and key.endswith("_URL")
    ]
    assert len(urls) >= 4
    for url in urls:
        parts = urlsplit(url)
        assert parts.scheme == "redis" and parts.username is not None
        assert parts.password == generated.passwords[parts.username]
        assert parts.hostname is not None and parts.hostname.startswith(host + ".svc")
        assert parts.port == service["spec"]["ports"][0]["port"]


# Compose


def test_compose_worker_health_check_and_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose's worker runs the health check and waits the job timeout before SIGKILL."""
    worker = compose()["services"]["worker"]
    assert worker["command"] == ["worker"]
    assert worker["healthcheck"]["test"] == ["CMD", *CHECK]
    settings = settings_from(worker["environment"], monkeypatch)
    assert "CTXSTORE_WORKER_NAME" not in worker["environment"], "scaled workers share a name"
    defaults = settings_from({"CTXSTORE_REDIS_URL": settings.redis_url}, monkeypatch)
    needed = max(job_timeout(settings), job_timeout(defaults))
    assert duration(worker["stop_grace_period"]) >= needed
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_compose_services_wait_for_a_healthy_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose runs redis:7 with deploy/redis.conf and its AOF on a volume; the others wait."""
    spec = compose()
    redis = spec["services"]["redis"]
    assert redis["image"] == "redis:7"
    conf = next(v for v in redis["volumes"] if v.startswith("./redis.conf:"))
    assert conf.split(":")[1] in redis["command"]
    data = next(v for v in redis["volumes"] if v.split(":")[1] == "/data")
    assert data.split(":")[0] in spec["volumes"], "the AOF is on a named volume"
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    assert spec["services"]["demo"]["command"] == ["demo"]
    assert spec["services"]["functions"]["command"] == ["functions", "load"]
    for name in ("functions", "worker", "demo"):
        service = spec["services"][name]
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
        if name != "functions":  # the scripts by FCALL from their first call
            functions = service["depends_on"]["functions"]["condition"]
            assert functions == "service_completed_successfully", name
        assert service["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        settings = settings_from(service["environment"], monkeypatch)
        assert urlsplit(settings.redis_url or "").hostname == "redis", name
        # Passed through only when set: an empty key would select Anthropic's summarizer.
        assert service["environment"].get("ANTHROPIC_API_KEY", None) is None, name


# Redis


def test_redis_configmap_sets_durability_acl_and_noeviction() -> None:
    """The Redis ConfigMap's redis.conf fsyncs every write, never evicts, and loads the ACL file."""
    conf = directives(manifest("ConfigMap", "ctxstore-redis-config")["data"]["redis.conf"])
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "always"
    assert conf["maxmemory-policy"] == "noeviction"
    assert conf["aclfile"] == "/etc/redis/users.acl"


def test_redis_conf_copies_agree() -> None:
    """deploy/redis.conf and the ConfigMap's copy agree on every directive but aclfile."""
    local = directives((DEPLOY / "redis.conf").read_text())
    k8s = directives(manifest("ConfigMap", "ctxstore-redis-config")["data"]["redis.conf"])
    assert "aclfile" not in local, "deploy/redis.conf keeps aclfile commented"
    k8s.pop("aclfile")
    assert local == k8s
    assert "stream-node-max-bytes" in local


LAZYFREE = ("lazyfree-lazy-server-del", "lazyfree-lazy-expire", "lazyfree-lazy-user-del")


async def lazyfreed(raw: Redis, above: int) -> int:
    """INFO's count of values freed in the background, once it is over ``above``.

    The background thread counts each value when it has freed it: polled, a bounded
    number of times (it never goes back), so a value not freed lazily fails the test.
    """
    for _ in range(1_000):
        freed = int((await raw.info("memory"))["lazyfreed_objects"])
        if freed > above:
            return freed
    return above


async def test_the_shipped_redis_frees_a_renamed_generation_and_a_deleted_index_lazily(
    private: PrivateRedis, tenant: str
) -> None:
    """deploy/redis.conf's lazyfree directives free large values off the main thread.

    On a server set as the file says, a rotation renaming over an idempotency
    generation of 100 keys, and a delete of a session whose search index holds
    600 words, each free their hash in the background; Redis's default frees them
    inline, stalling every client for as long as that takes.
    """
    shipped = directives((DEPLOY / "redis.conf").read_text())
    raw = Redis.from_url(private.url())
    try:
        for name in LAZYFREE:
            assert shipped[name] == "yes", name
            await raw.config_set(name, shipped[name])
        settings = Settings(redis_url=private.url(), key_prefix="lazy")
        async with ContextStore.from_settings(settings, tenant=tenant) as store:
            keys = store.keys("s")
            notes = [
                {"role": "user", "content": " ".join(f"w{i}x{j}" for j in range(6))}
                for i in range(100)
            ]
            await store.append_many("s", notes)
            assert await store.search("s", "w7x3")
            # Past hash-max-listpack-entries (512 here): a listpack is one allocation, freed
            # at once; a hashtable is one per field.
            assert await raw.object("encoding", keys.index) == b"hashtable"

            async def next_generation(n: int) -> None:
                since = int(await raw.hget(keys.meta, "idem_since") or 0)  # type: ignore[misc]
                back = since - int(settings.idempotency_seconds * 2_000)
                await raw.hset(keys.meta, "idem_since", str(back))  # type: ignore[misc]
                await store.append("s", {"role": "user", "content": f"next {n}"})

            await next_generation(0)  # the 100 keys become the old generation
            assert await raw.hlen(keys.idem_old) > 64  # type: ignore[misc]
            before = await lazyfreed(raw, -1)
            await next_generation(1)  # renamed over: freed
            before = await lazyfreed(raw, before)
            assert before > 0
            assert await store.delete("s")
            assert await lazyfreed(raw, before) > before
    finally:
        await raw.aclose()


def test_redis_mounts_its_config_and_acl_where_redis_conf_says() -> None:
    """The StatefulSet runs redis:7 on the mounted redis.conf, ACL file at the aclfile path."""
    redis = container("ctxstore-redis")
    assert redis["image"] == "redis:7"
    assert "command" not in redis, "the image's entrypoint stays in front"
    conf = directives(manifest("ConfigMap", "ctxstore-redis-config")["data"]["redis.conf"])
    volumes = {v["name"]: v for v in dict(pod_specs())["ctxstore-redis"]["volumes"]}
    mounted: set[str] = set()
    for mount in redis["volumeMounts"]:
        volume = volumes.get(mount["name"], {})
        for source in volume.get("projected", {}).get("sources", []):
            ref = source.get("configMap") or source["secret"]
            mounted |= {f"{mount['mountPath']}/{item['path']}" for item in ref["items"]}
    assert conf["aclfile"] in mounted
    (conf_path,) = [a for a in redis["args"] if a.endswith(".conf")]
    assert conf_path in mounted


def test_redis_keeps_its_aof_on_a_claim() -> None:
    """Redis's working directory, where the AOF goes, is a PersistentVolumeClaim."""
    statefulset = manifest("StatefulSet", "ctxstore-redis")
    claims = {c["metadata"]["name"] for c in statefulset["spec"]["volumeClaimTemplates"]}
    data = [m for m in container("ctxstore-redis")["volumeMounts"] if m["mountPath"] == "/data"]
    assert len(data) == 1 and data[0]["name"] in claims
    assert "dir" not in directives(
        manifest("ConfigMap", "ctxstore-redis-config")["data"]["redis.conf"]
    ), "the image's working directory, /data, is the AOF's"


def probe_user() -> str:
    """The user the Redis StatefulSet's readiness probe logs in as."""
    probe = container("ctxstore-redis")["readinessProbe"]["exec"]["command"]
    words = shlex.split(probe[-1])
    return words[words.index("--user") + 1]


def test_generated_acl_shuts_the_default_user_and_has_the_probes_user(
    generated: Generated,
) -> None:
    """users.acl turns `default` off, holds no comment, and has the probe's PING-only user."""
    acl = generated.secrets["ctxstore-redis-acl"]
    lines = acl["users.acl"].splitlines()
    assert lines[0] == "user default off"
    assert not [ln for ln in lines if ln.lstrip().startswith("#")], "an ACL file holds no comments"
    (line,) = [ln for ln in lines if ln.startswith(f"user {probe_user()} ")]
    assert "+ping" in line.split() and "-@all" in line.split()
    digest = hashlib.sha256(acl["probe-password"].encode()).hexdigest()
    assert f"#{digest}" in line.split()
    users = {ln.split()[1] for ln in lines}
    assert {POD_USER, WORKER_USER, "ctxstore-t-acme", "admin", probe_user()} <= users


@pytest.mark.skipif(redis7_binary() is None, reason="the rendered users need Redis 7")
async def test_generated_acl_lets_each_secrets_user_in_with_its_rights(
    generated: Generated, servers: ServerPool
) -> None:
    """A Redis 7 loads users.acl; each Secret's URL and the probe's password log in, no one else."""
    server = servers.start(acl="user default on nopass ~* &* +@all\n")
    assert server.acl_path is not None
    server.acl_path.write_text(generated.secrets["ctxstore-redis-acl"]["users.acl"])
    setup = Redis.from_url(server.url())
    try:
        await setup.execute_command("ACL", "LOAD")
    finally:
        await setup.aclose()

    async def ping(url: str) -> bool:
        client = Redis.from_url(url)
        try:
            return bool(await client.ping())
        finally:
            await client.aclose()

    here = f"127.0.0.1:{server.port}"
    for name in ("ctxstore-worker", "ctxstore-pod"):
        for key in ("CTXSTORE_REDIS_URL", "CTXSTORE_QUEUE_URL"):
            parts = urlsplit(generated.secrets[name][key])
            assert await ping(
                parts._replace(netloc=f"{parts.netloc.split('@')[0]}@{here}").geturl()
            )
    probe_password = generated.secrets["ctxstore-redis-acl"]["probe-password"]
    assert await ping(server.url(probe_user(), probe_password))
    probe = Redis.from_url(server.url(probe_user(), probe_password))
    try:
        with pytest.raises(NoPermissionError):
            await probe.get("any")
    finally:
        await probe.aclose()
    with pytest.raises((AuthenticationError, ResponseError)):
        await ping(server.url())  # the default user is off
    admin = Redis.from_url(server.url("admin", generated.passwords["admin"]))
    try:
        assert await admin.execute_command("ACL", "LOAD")  # what the docs run after a change
    finally:
        await admin.aclose()


# Autoscaling


def prometheus_triggers() -> dict[str, dict[str, str]]:
    """The ScaledObject's triggers by name: each a ``prometheus`` trigger's metadata."""
    scaled = manifest("ScaledObject", "ctxstore-worker")["spec"]
    found = {}
    for trigger in scaled["triggers"]:
        assert trigger["type"] == "prometheus", trigger
        assert trigger["metricType"] == "AverageValue", trigger
        metadata = trigger["metadata"]
        assert all(isinstance(v, str) for v in metadata.values()), "KEDA's metadata is strings"
        found[trigger["name"]] = metadata
    return found


def test_scaled_object_scales_the_worker_on_prometheus() -> None:
    """The ScaledObject scales the worker Deployment on Prometheus, min 1 (the sweep)."""
    scaled = manifest("ScaledObject", "ctxstore-worker")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "ctxstore-worker"
    manifest("Deployment", scaled["scaleTargetRef"]["name"])
    assert scaled["minReplicaCount"] >= 1
    assert scaled["maxReplicaCount"] > scaled["minReplicaCount"]
    assert set(prometheus_triggers()) == {"queue-depth", "summary-lag"}
    for metadata in prometheus_triggers().values():
        address = urlsplit(metadata["serverAddress"])
        assert address.scheme in ("http", "https") and address.hostname, metadata
        assert metadata["ignoreNullValues"] == "true"


@pytest.mark.parametrize(
    ("trigger", "metric"),
    [
        ("queue-depth", "ctxstore_summary_queue_depth"),
        ("summary-lag", "ctxstore_summary_lag_tokens_max"),
    ],
)
def test_each_trigger_takes_the_max_of_a_gauge_every_worker_reports(
    trigger: str, metric: str
) -> None:
    """A trigger's query is the max across workers (each reports the whole queue) of one gauge."""
    query = prometheus_triggers()[trigger]["query"]
    match = re.fullmatch(r"max\((ctxstore_[a-z0-9_]+)\{namespace=\"([a-z0-9-]+)\"\}\)", query)
    assert match is not None, f"not max(<gauge>{{namespace=...}}): {query}"
    assert match.group(1) == metric
    assert match.group(2) == NAMESPACE
    registry = CollectorRegistry()
    Metrics(registry)
    types = {family.name: family.type for family in registry.collect()}
    assert types[metric] == "gauge"


def test_queue_depth_target_is_the_jobs_one_worker_runs() -> None:
    """Depth: one worker per MAX_JOBS jobs, the jobs a worker runs at once."""
    assert int(prometheus_triggers()["queue-depth"]["threshold"]) == MAX_JOBS


def test_lag_target_is_above_the_summary_trigger() -> None:
    """Lag: the next sessions in line are at least the trigger behind; the target is well above."""
    trigger = int(
        manifest("ConfigMap", "ctxstore-settings")["data"]["CTXSTORE_SUMMARY_TRIGGER_TOKENS"]
    )
    threshold = int(prometheus_triggers()["summary-lag"]["threshold"])
    assert threshold >= 2 * trigger, "at the trigger, every queued session would add a worker"


def test_workers_serve_metrics_where_prometheus_scrapes() -> None:
    """The worker runs --metrics-port N, declares port N, and its annotations scrape N /metrics."""
    worker = container("ctxstore-worker")
    args = cli_parser().parse_args(worker["args"])
    assert args.command == "worker" and not args.burst and not args.check
    (declared,) = [p for p in worker["ports"] if p["name"] == "metrics"]
    assert declared["containerPort"] == args.metrics_port
    annotations = manifest("Deployment", "ctxstore-worker")["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(args.metrics_port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_example_agent_is_scraped_on_the_port_it_declares() -> None:
    """The example agent pod's annotations name the metrics port its container declares."""
    agent = manifest("Deployment", "example-agent")["spec"]["template"]
    (declared,) = [p for p in container("example-agent")["ports"] if p["name"] == "metrics"]
    assert agent["metadata"]["annotations"]["prometheus.io/port"] == str(declared["containerPort"])


def test_nothing_names_the_removed_queue_depth_exporter() -> None:
    """The hand-written exporter is gone: no file of deploy/ nor the README names it."""
    for path in [REPO / "README.md", *sorted(p for p in DEPLOY.rglob("*") if p.is_file())]:
        text = path.read_text()
        for name in ("queue_depth_exporter", "ctxstore-queue-depth", "metrics-api"):
            assert name not in text, f"{path.relative_to(REPO)} names {name}"


# The dashboard


DASHBOARD = DEPLOY / "grafana" / "ctxstore-dashboard.json"


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_dashboard_queries_name_only_metrics_ctxstore_defines() -> None:
    """Every series a panel reads is one ctxstore serves (no typo, no renamed metric)."""
    served = set().union(*metric_names().values())
    named = {name for expr in dashboard_queries() for name in METRIC.findall(expr)}
    assert named and named <= served, named - served


def test_dashboard_charts_every_metric() -> None:
    """Each metric ctxstore defines is on at least one panel."""
    text = " ".join(dashboard_queries())
    missing = [
        name for name, series in metric_names().items() if not series & set(METRIC.findall(text))
    ]
    assert not missing, missing


def test_dashboard_panels_use_the_datasource_variable() -> None:
    """Every panel and query reads the ``datasource`` variable; panel ids are unique."""
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = dashboard["templating"]["list"]
    assert (variable["type"], variable["name"], variable["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(
            t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]
        )


# The image


def test_dockerfile_installs_the_repo_and_runs_ctxstore_as_non_root() -> None:
    """The image is python:3.11-slim, installs the repo, runs `ctxstore` as non-root."""
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^RUN pip wheel .*--wheel-dir /wheels \.$", text, re.M), "builds the repo"
    stage = dockerfile_final_stage()
    assert stage[0].split()[1] == "python:3.11-slim"
    assert any(ln.startswith("RUN ") and "pip install" in ln and "ctxstore" in ln for ln in stage)
    (user,) = [ln.split()[1] for ln in stage if ln.startswith("USER ")]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    (entrypoint,) = [ln for ln in stage if ln.startswith("ENTRYPOINT ")]
    assert json.loads(entrypoint.removeprefix("ENTRYPOINT ")) == ["ctxstore"]


def test_dockerignore_lets_in_what_the_dockerfile_copies() -> None:
    """Every file the Dockerfile copies from the context is let in by its .dockerignore."""
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    text = (DEPLOY / "Dockerfile").read_text()
    sources = [
        src
        for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M)
        for src in line.split()[:-1]
    ]
    assert len(sources) >= 4
    for src in sources:
        assert src.rstrip("/").removeprefix("./") in allowed, src
        assert (REPO / src).exists(), src
