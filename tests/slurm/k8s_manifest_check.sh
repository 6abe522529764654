#!/usr/bin/env bash
# Checks the Kubernetes job files (no cluster runs here): yamllint for YAML
# syntax and style, then the fields the sharded job relies on, read with
# python3-yaml: an Indexed Job with per-index retries whose completions,
# parallelism and QTK_SHARD_COUNT agree, running `generate --shard auto`,
# and a merge Job over the same volume.
set -euo pipefail
cd "$(dirname "$0")/../.."
yamllint -d '{extends: default, rules: {line-length: {max: 100}, document-start: disable}}' \
  scripts/k8s/*.yaml
python3 - <<'PY'
import sys, yaml
def fail(msg):
    sys.exit(f"k8s_manifest_check: FAILED: {msg}")
job = yaml.safe_load(open("scripts/k8s/generate-indexed-job.yaml"))
merge = yaml.safe_load(open("scripts/k8s/merge-job.yaml"))
for doc, name in ((job, "generate-indexed-job.yaml"), (merge, "merge-job.yaml")):
    if doc.get("apiVersion") != "batch/v1" or doc.get("kind") != "Job":
        fail(f"{name}: expected apiVersion batch/v1, kind Job")
    if doc["spec"]["template"]["spec"].get("restartPolicy") != "Never":
        fail(f"{name}: spec.template.spec.restartPolicy: expected Never")
spec = job["spec"]
if spec.get("completionMode") != "Indexed":
    fail("spec.completionMode: expected Indexed")
if not isinstance(spec.get("backoffLimitPerIndex"), int):
    fail("spec.backoffLimitPerIndex: expected an integer")
c = spec["template"]["spec"]["containers"][0]
env = {e["name"]: e["value"] for e in c.get("env", [])}
if str(spec.get("completions")) != env.get("QTK_SHARD_COUNT"):
    fail(f"QTK_SHARD_COUNT {env.get('QTK_SHARD_COUNT')} != completions {spec.get('completions')}")
if spec.get("parallelism", 0) > spec["completions"]:
    fail("spec.parallelism exceeds completions")
cmd = " ".join(c.get("command", []) + c.get("args", []))
if "--shard auto" not in cmd or "${JOB_COMPLETION_INDEX}" not in cmd:
    fail("the generate container must run --shard auto with a per-index --out")
mcmd = " ".join(merge["spec"]["template"]["spec"]["containers"][0]["args"])
if "merge" not in mcmd:
    fail("merge-job.yaml must run merge")
vol = lambda d: d["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
if vol(job) != vol(merge):
    fail("the two jobs must mount the same volume claim")
print("k8s_manifest_check: OK: Indexed Job of", spec["completions"], "shards + merge Job")
PY
