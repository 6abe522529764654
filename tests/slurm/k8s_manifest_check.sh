#!/usr/bin/env bash
# Checks the Kubernetes job files (no cluster runs here): yamllint for YAML
# syntax and style, then the fields the sharded job relies on, read with
# python3-yaml: an Indexed Job with per-index retries whose completions,
# parallelism and QTK_SHARD_COUNT agree, running `generate --shard auto`
# (with --device cuda exactly when it requests a GPU), and a merge Job over
# the same volume. Then both containers' shell commands are run here with
# stand-ins for generate and merge, the volume a temporary directory: the
# output directory must be created, exit status 3 (error lines, a finished
# run) must end the pod with 0, and 1 must still fail it.
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
gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
if bool(gpus) != ("--device cuda" in cmd):
    fail("the generate container requests nvidia.com/gpu exactly when it runs --device cuda "
         f"(found nvidia.com/gpu: {gpus}, --device cuda {'' if '--device cuda' in cmd else 'not '}in "
         "the command)")

# The containers' commands, run with stand-ins: /opt/qtk/bin -> a directory
# of stub scripts, the mount path -> a temporary directory.
import os, re, subprocess, tempfile
def container_cmd(doc, name):
    ct = doc["spec"]["template"]["spec"]["containers"][0]
    if ct.get("command") != ["/bin/sh", "-c"] or len(ct.get("args", [])) != 1:
        fail(f"{name}: expected command [/bin/sh, -c] and one args string")
    mount = ct["volumeMounts"][0]["mountPath"]
    return ct["args"][0], mount
# A stand-in exits $STUB_STATUS, or 1 as the real one does when OUT's
# directory is missing (generate: --out's value; merge: its first operand).
STUB = """#!/bin/sh
out=""
if [ "$(basename "$0")" = generate ]; then
  while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
else
  for a in "$@"; do case "$a" in -*) ;; *) out=$a; break ;; esac; done
fi
d=$(dirname "${out:?stub: no OUT}")
[ -d "$d" ] || { echo "stub: directory $d does not exist" >&2; exit 1; }
exit "$STUB_STATUS"
"""
with tempfile.TemporaryDirectory() as tmp:
    for doc, name, tool in ((job, "generate-indexed-job.yaml", "generate"),
                            (merge, "merge-job.yaml", "merge")):
        text, mount = container_cmd(doc, name)
        m = re.search(r"(\S+)/" + tool + r"\s", text)
        if not m:
            fail(f"{name}: found no {tool} command in {text!r}")
        for status, want in ((0, 0), (3, 0), (1, 1), (2, 2)):
            run = os.path.join(tmp, f"{tool}-{status}")
            os.makedirs(os.path.join(run, "bin"))
            os.makedirs(os.path.join(run, "data"))
            stub = os.path.join(run, "bin", tool)
            with open(stub, "w") as f:
                f.write(STUB)
            os.chmod(stub, 0o755)
            if tool == "merge":  # the shards the generate pods left
                os.makedirs(os.path.join(run, "data", "run"))
                open(os.path.join(run, "data", "run", "shard-0.jsonl"), "w").close()
            here_cmd = text.replace(m.group(1) + "/", os.path.join(run, "bin") + "/")
            here_cmd = here_cmd.replace(mount + "/", os.path.join(run, "data") + "/")
            penv = dict(os.environ, STUB_STATUS=str(status), JOB_COMPLETION_INDEX="0",
                        QTK_SHARD_COUNT=env.get("QTK_SHARD_COUNT", "1"))
            r = subprocess.run(["/bin/sh", "-c", here_cmd], env=penv, capture_output=True, text=True)
            if r.returncode != want:
                fail(f"{name}: with {tool} exiting {status} the container exits {r.returncode}, "
                     f"expected {want} ({r.stderr.strip()})")
print("k8s_manifest_check: OK: Indexed Job of", spec["completions"], "shards + merge Job;",
      "exit status 3 ends both pods with 0, 1 fails them; the output directory is created")
PY
