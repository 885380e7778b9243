"""Checks deploy/kubernetes/*.yaml as far as a machine without Kubernetes can.

Every document parses and has the fields its kind needs (a StatefulSet's
selector matching its pod labels, a volume for every mount, resource
requests on every container, probes on the master, ports the Service names);
MPIJobs are kubeflow.org/v2beta1 with a Launcher and Workers; the parameter
shards reach the master's Service and advertise their pods' stable names; every
command's flags exist in the real binary (`BINARY --helpfull`), and the
probes run the real `mpilearnctl health`. The Prometheus scrape
configuration passes `promtool check config` where promtool is installed.

usage: check_manifests.py MANIFEST_DIR MASTER WORKER MPILEARNCTL
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message, file=sys.stderr)


def flags_of(binary):
    """The --flags a binary's --helpfull lists."""
    out = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=60)
    return set(re.findall(r"^\s+--([a-z_0-9]+)\b", out.stdout + out.stderr, re.M))


def containers(pod_spec):
    return pod_spec.get("containers", []) + pod_spec.get("initContainers", [])


def check_pod(where, pod_spec, binaries):
    volumes = {v["name"] for v in pod_spec.get("volumes", [])}
    for container in containers(pod_spec):
        name = "%s/%s" % (where, container.get("name"))
        if not container.get("image"):
            fail(name + ": no image")
        if "requests" not in container.get("resources", {}):
            fail(name + ": no resources.requests")
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes and mount["name"] not in binaries["claims"]:
                fail("%s: mounts %s, which no volume defines" % (name, mount["name"]))
        commands = [container.get("command", [])]
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in container:
                commands.append(container[probe].get("exec", {}).get("command", []))
        for command in commands:
            check_command(name, command, binaries)


def check_command(where, command, binaries):
    """Flags of our binaries in `command` exist; returns the binary found."""
    found = None
    for word in command:
        base = os.path.basename(word)
        if base in binaries["flags"]:
            found = base
            continue
        if found and word.startswith("--"):
            flag = word[2:].split("=", 1)[0]
            if flag not in binaries["flags"][found]:
                fail("%s: %s has no flag --%s" % (where, found, flag))
    return found


def service_and_set(name, docs):
    """The one Service and the one StatefulSet of `docs`, or None."""
    services = [d for d in docs if d["kind"] == "Service"]
    sets = [d for d in docs if d["kind"] == "StatefulSet"]
    if len(services) != 1 or len(sets) != 1:
        fail(name + ": want one Service and one StatefulSet")
        return None
    return services[0], sets[0]


def check_master(docs, binaries):
    found = service_and_set("master.yaml", docs)
    if found is None:
        return
    service, stateful = found
    spec = stateful["spec"]
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    for key, value in spec["selector"]["matchLabels"].items():
        if labels.get(key) != value:
            fail("StatefulSet: selector %s=%s does not match the pod labels" % (key, value))
    for key, value in service["spec"]["selector"].items():
        if labels.get(key) != value:
            fail("Service: selector %s=%s matches no master pod" % (key, value))
    if spec.get("serviceName") != service["metadata"]["name"]:
        fail("StatefulSet.serviceName is not the Service's name")
    if spec.get("replicas") != 1:
        fail("StatefulSet: one master per state directory (replicas: 1)")
    binaries["claims"] = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
    if "state" not in binaries["claims"]:
        fail("StatefulSet: no volumeClaimTemplate for the state directory")
    check_pod("StatefulSet", pod["spec"], binaries)
    master = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in master.get("ports", [])}
    for port in service["spec"]["ports"]:
        if port["targetPort"] not in ports:
            fail("Service port %s targets %s, which the container does not name"
                 % (port["name"], port["targetPort"]))
    command = master["command"]
    args = dict(w[2:].split("=", 1) for w in command if w.startswith("--") and "=" in w)
    if args.get("listen", "").split(":")[-1] != str(ports.get("grpc")):
        fail("--listen's port is not the grpc containerPort")
    if args.get("metrics_listen", "").split(":")[-1] != str(ports.get("metrics")):
        fail("--metrics_listen's port is not the metrics containerPort")
    mounts = {m["name"]: m["mountPath"] for m in master.get("volumeMounts", [])}
    if not args.get("state_dir", "").startswith(mounts.get("state", "/nowhere")):
        fail("--state_dir is not on the state volume")
    for probe in ("readinessProbe", "livenessProbe"):
        probe_command = master.get(probe, {}).get("exec", {}).get("command", [])
        if "health" not in probe_command:
            fail("master: %s does not run `mpilearnctl health`" % probe)
        socket = [w for w in probe_command if w.startswith("--master=unix:")]
        if not socket or socket[0][len("--master=unix:"):] != args.get("listen_unix"):
            fail("master: %s does not reach --listen_unix" % probe)


def check_shards(docs, binaries):
    found = service_and_set("shards.yaml", docs)
    if found is None:
        return
    service, stateful = found
    spec = stateful["spec"]
    labels = spec["template"]["metadata"]["labels"]
    for key, value in list(spec["selector"]["matchLabels"].items()) + list(
            service["spec"]["selector"].items()):
        if labels.get(key) != value:
            fail("shards.yaml: selector %s=%s does not match the shard pods" % (key, value))
    name = service["metadata"]["name"]
    if spec.get("serviceName") != name or service["spec"].get("clusterIP") != "None":
        fail("shards.yaml: the StatefulSet needs a headless Service of its own (pod names)")
    binaries["claims"] = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
    check_pod("shards.yaml", spec["template"]["spec"], binaries)
    shard = spec["template"]["spec"]["containers"][0]
    args = dict(w[2:].split("=", 1) for w in shard["command"] if w.startswith("--") and "=" in w)
    port = {p["name"]: p["containerPort"] for p in shard.get("ports", [])}.get("grpc")
    if args.get("shard_of") != "mpilearn-master:7070":
        fail("shards.yaml: --shard_of must name the master's Service (mpilearn-master:7070)")
    if args.get("advertise") != "$(POD_NAME).%s:%s" % (name, port):
        fail("shards.yaml: --advertise must be the pod's stable name $(POD_NAME).%s:%s"
             % (name, port))
    env = {e["name"] for e in shard.get("env", [])}
    if "POD_NAME" not in env:
        fail("shards.yaml: POD_NAME is not in the container's env")
    if args.get("listen", "").split(":")[-1] != str(port):
        fail("shards.yaml: --listen's port is not the grpc containerPort")
    mounts = {m["name"]: m["mountPath"] for m in shard.get("volumeMounts", [])}
    if "state" not in binaries["claims"] or not args.get("state_dir", "").startswith(
            mounts.get("state", "/nowhere")):
        fail("shards.yaml: --state_dir is not on a volume of the shard's own")
    for flag in ("lead_token_file", "tokens_file"):
        if not args.get(flag, "").startswith(mounts.get("secrets", "/nowhere")):
            fail("shards.yaml: --%s is not in the mounted Secret" % flag)


def check_mpijob(name, doc, binaries):
    if doc.get("apiVersion") != "kubeflow.org/v2beta1" or doc.get("kind") != "MPIJob":
        fail(name + ": want kind MPIJob, apiVersion kubeflow.org/v2beta1")
        return
    replicas = doc["spec"].get("mpiReplicaSpecs", {})
    if set(replicas) != {"Launcher", "Worker"}:
        fail(name + ": mpiReplicaSpecs needs Launcher and Worker")
        return
    if replicas["Launcher"].get("replicas") != 1:
        fail(name + ": one launcher")
    binaries["claims"] = set()
    for role, replica in replicas.items():
        check_pod("%s/%s" % (name, role), replica["template"]["spec"], binaries)
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]["command"]
    if launcher[:1] != ["mpirun"] or "mpilearn-worker" not in launcher:
        fail(name + ": the launcher must run mpirun ... mpilearn-worker")
    np = launcher[launcher.index("-np") + 1] if "-np" in launcher else None
    workers = replicas["Worker"].get("replicas", 0) * doc["spec"].get("slotsPerWorker", 1)
    if np is None or int(np) != workers:
        fail("%s: mpirun -np %s but %d worker slots" % (name, np, workers))
    if not any(w.startswith("--master=mpilearn-master:") for w in launcher):
        fail(name + ": the group must reach the master's Service")


def main():
    manifest_dir, master, worker, ctl = sys.argv[1:5]
    binaries = {"flags": {"mpilearn-master": flags_of(master),
                          "mpilearn-worker": flags_of(worker),
                          "mpilearnctl": flags_of(ctl)},
                "claims": set()}
    for binary, flags in binaries["flags"].items():
        if len(flags) < 5:
            fail("%s --helpfull listed %d flags; cannot check against it" % (binary, len(flags)))
    documents = {}
    for name in sorted(os.listdir(manifest_dir)):
        if name.endswith(".yaml"):
            with open(os.path.join(manifest_dir, name)) as f:
                documents[name] = [d for d in yaml.safe_load_all(f) if d]
    for name in ("master.yaml", "shards.yaml", "training-group.yaml", "validation-pool.yaml",
                 "prometheus-scrape.yaml"):
        if name not in documents:
            fail("missing " + name)
    check_master(documents.get("master.yaml", []), binaries)
    check_shards(documents.get("shards.yaml", []), binaries)
    for name in ("training-group.yaml", "validation-pool.yaml"):
        for doc in documents.get(name, []):
            check_mpijob(name, doc, binaries)
    pool = documents.get("validation-pool.yaml", [{}])[0]
    launcher = pool["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    if "--role=validate" not in launcher["command"]:
        fail("validation-pool.yaml: the pool must run --role=validate")
    scrape = documents.get("prometheus-scrape.yaml", [{}])[0]
    config = scrape.get("data", {}).get("prometheus.yml", "")
    targets = yaml.safe_load(config)["scrape_configs"][0]["static_configs"][0]["targets"]
    if targets != ["mpilearn-master:7071"]:
        fail("prometheus-scrape.yaml: scrape mpilearn-master:7071 (the Service's metrics port)")
    promtool = "/usr/bin/promtool"
    if os.access(promtool, os.X_OK):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "prometheus.yml")
            token = os.path.join(tmp, "metrics-token")
            with open(token, "w") as f:
                f.write("token\n")
            with open(path, "w") as f:
                f.write(config.replace("/etc/mpilearn/metrics-token", token))
            out = subprocess.run([promtool, "check", "config", path], capture_output=True,
                                 text=True, timeout=60)
            if out.returncode != 0:
                fail("promtool check config: " + out.stdout + out.stderr)
    else:
        print("SKIP: promtool not installed; the scrape configuration is only parsed")
    if failures:
        sys.exit(1)
    print("ok: %d manifests, %d documents" % (len(documents),
                                              sum(len(d) for d in documents.values())))


if __name__ == "__main__":
    main()
