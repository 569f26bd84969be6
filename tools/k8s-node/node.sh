#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine: start, stop, status.
#
#   tools/k8s-node/node.sh up       start it (idempotent: a running node is left as it is);
#                                   prints the admin kubeconfig's path on stdout
#   tools/k8s-node/node.sh down     stop everything it started and remove its state (idempotent;
#                                   kept: containerd's image store, so the next `up` is quicker)
#   tools/k8s-node/node.sh status   exit 0 when the node is up and Ready
#   tools/k8s-node/node.sh check    exit 0 when this machine can run the node, else say why (exit 3:
#                                   the machine cannot, e.g. no root or kernel features; 1: an
#                                   install step is missing)
#   tools/k8s-node/node.sh kubeconfig  print the admin kubeconfig's path
#   tools/k8s-node/node.sh image NAME  build one of build-image.sh's images (NAME: sluice, spark) if
#                                   it is not current and import it into the running node's
#                                   containerd; prints its reference (the Spark image is only
#                                   needed by Spark jobs, so `up` leaves it to this command)
#
# What `up` runs, each a process of its own with a pid file in $STATE (default
# /var/lib/sluice-node/run) and its log beside it:
#   etcd, kube-apiserver   tools/k8s-testenv's builds; the API server on https://127.0.0.1:$PORT
#                          (client-certificate auth against a CA made for this run, RBAC + Node)
#   kube-controller-manager, kube-scheduler   the same Kubernetes release (tools/k8s-testenv)
#   containerd             Debian's (1.6), its own instance: own socket, config and state, so a
#                          machine's system containerd (if any) is never touched; runc, the
#                          cgroupfs driver, overlayfs, sandbox image localhost/pause:3.10 (built
#                          here from tools/k8s-testenv/cmd/pause: no registry is reachable)
#   kubelet                cgroupfs, failCgroupV1 false (these machines mount cgroup v1 and v2
#                          side by side), a CNI config with the loopback plugin only
# Then it imports the Sluice image (tools/k8s-node/build-image.sh) and the pause image into
# containerd, waits for the node to be Ready, and creates the StorageClass "sluice-local" with
# $SLUICE_NODE_PVS local PersistentVolumes (directories under $STATE/pv, bound to this node).
#
# Networking: no pod network can run here (no bridge/CNI with pod IPs), so only pods with
# hostNetwork: true work; there is no kube-proxy, so no Service virtual IP is reachable, and no
# cluster DNS. Pods reach the API server at 127.0.0.1:$PORT (the chart's kubernetesApiServer
# values); the node registers with its interface address ($SLUICE_NODE_IP, default: the first
# global IPv4 address), which is also where hostNetwork pods listen.
#
# Environment: SLUICE_NODE_DIR (state root, default /var/lib/sluice-node), SLUICE_NODE_PORT
# (API server port, default 16443), SLUICE_NODE_ETCD_PORT (default 16379), SLUICE_NODE_IP,
# SLUICE_NODE_PVS (default 12: the node tests install two releases, one of which grows to five
# brokers, and a release's volumes outlive it), SLUICE_K8S_BIN / SLUICE_K8S_CACHE (where build.sh put the binaries).
# Needs root (containerd, kubelet, mounts).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/tools/k8s-node"
NODE_DIR="${SLUICE_NODE_DIR:-/var/lib/sluice-node}"
STATE="$NODE_DIR/run"
IMAGES="$NODE_DIR/containerd"            # containerd's root: images survive `down`
PORT="${SLUICE_NODE_PORT:-16443}"
ETCD_PORT="${SLUICE_NODE_ETCD_PORT:-16379}"
PVS="${SLUICE_NODE_PVS:-12}"
BIN="${SLUICE_K8S_BIN:-${SLUICE_K8S_CACHE:-$HOME/.cache/sluice-k8s}/bin}"
SOCK="$STATE/containerd/containerd.sock"
PAUSE_IMAGE="localhost/pause:3.10"
KUBECONFIG_FILE="$STATE/admin.kubeconfig"
export CONTAINERS_CONF="$HERE/containers.conf"
START=$(date +%s)
log() { printf '[k8s-node %4ds] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

node_ip() {
    if [[ -n "${SLUICE_NODE_IP:-}" ]]; then echo "$SLUICE_NODE_IP"; return; fi
    ip -4 -o addr show scope global | awk '{split($4, a, "/"); print a[1]; exit}'
}
node_name() { hostname | tr '[:upper:]' '[:lower:]'; }
kubectl() { "$BIN/kubectl" --kubeconfig="$KUBECONFIG_FILE" "$@"; }
ctr_() { ctr --address "$SOCK" --namespace k8s.io "$@"; }
alive() { [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

# -- check ---------------------------------------------------------------------------------------

# Exit 3: the machine itself cannot (no root, a kernel without overlayfs, cgroups or namespaces):
# the tests skip, saying why. Exit 1: something the project installs is missing: they fail.
check() { # what the node needs from this machine; prints the first thing missing
    [[ "$(id -u)" == 0 ]] || { echo "the node needs root (containerd, kubelet and their mounts)"; return 3; }
    for t in containerd runc ctr podman mmdebstrap openssl; do
        command -v "$t" >/dev/null || { echo "'$t' is missing: apt-get install containerd runc podman buildah mmdebstrap"; return 1; }
    done
    grep -qw overlay /proc/filesystems || { echo "the kernel has no overlay filesystem (containerd's snapshotter)"; return 3; }
    [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers || -f /sys/fs/cgroup/unified/cgroup.controllers ]] \
        || { echo "no usable cgroup hierarchy under /sys/fs/cgroup"; return 3; }
    [[ -e /proc/self/ns/pid && -e /proc/self/ns/mnt ]] || { echo "the kernel lacks PID or mount namespaces"; return 3; }
    [[ -x /usr/lib/cni/loopback ]] || { echo "/usr/lib/cni/loopback is missing: apt-get install containernetworking-plugins"; return 1; }
    for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl pause; do
        [[ -x "$BIN/$b" ]] || { echo "$BIN/$b is missing: run tools/k8s-testenv/build.sh"; return 1; }
    done
    [[ -n "$(node_ip)" ]] || { echo "no global IPv4 address for the node (set SLUICE_NODE_IP)"; return 1; }
}

# -- certificates --------------------------------------------------------------------------------

pki() {
    local d="$STATE/pki" ip; ip="$(node_ip)"
    mkdir -p "$d"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj "/CN=sluice-node-ca" \
        -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
    issue() { # issue NAME SUBJECT EXT
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$2" \
            -keyout "$d/$1.key" -out "$d/$1.csr" 2>/dev/null
        printf '%s\n' "$3" > "$d/$1.ext"
        openssl x509 -req -in "$d/$1.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 7 \
            -extfile "$d/$1.ext" -out "$d/$1.crt" 2>/dev/null
    }
    issue apiserver "/CN=kube-apiserver" \
        "subjectAltName=IP:127.0.0.1,IP:$ip,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth"
    # One throwaway node with one user: every component acts as system:masters (the kubelet as
    # system:node:NAME too, which the Node authorizer needs to recognise it).
    issue admin "/O=system:masters/CN=sluice-node-admin" "extendedKeyUsage=clientAuth"
    issue kubelet "/O=system:nodes/O=system:masters/CN=system:node:$(node_name)" "extendedKeyUsage=clientAuth"
    issue apiserver-kubelet "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
    openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
    openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
    for who in admin kubelet; do
        cat > "$STATE/$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sluice-node
  cluster:
    server: https://127.0.0.1:$PORT
    certificate-authority-data: $(base64 -w0 "$d/ca.crt")
users:
- name: $who
  user:
    client-certificate-data: $(base64 -w0 "$d/$who.crt")
    client-key-data: $(base64 -w0 "$d/$who.key")
contexts:
- name: sluice-node
  context: {cluster: sluice-node, user: $who}
current-context: sluice-node
EOF
        chmod 600 "$STATE/$who.kubeconfig"
    done
}

# -- processes -----------------------------------------------------------------------------------

spawn() { # spawn NAME ARGV...: start a daemon in its own session, pid file and log in $STATE
    local name="$1"; shift
    setsid "$@" > "$STATE/$name.log" 2>&1 < /dev/null &
    echo $! > "$STATE/$name.pid"
}

wait_for() { # wait_for SECONDS WHAT COMMAND...
    local limit="$1" what="$2"; shift 2
    local until=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        (( $(date +%s) < until )) || die "$what not within ${limit}s (logs in $STATE)"
        sleep 1
    done
}

containerd_config() {
    mkdir -p "$STATE/containerd" "$STATE/cni" "$IMAGES"
    cat > "$STATE/cni/10-loopback.conflist" <<'EOF'
{"cniVersion": "0.4.0", "name": "sluice-loopback", "plugins": [{"type": "loopback"}]}
EOF
    cat > "$STATE/containerd/config.toml" <<EOF
version = 2
root = "$IMAGES"
state = "$STATE/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # The VM does not let processes lower their OOM score adjustment.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni"
EOF
}

kubelet_config() {
    mkdir -p "$STATE/kubelet"
    cat > "$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
# The API server reaches the kubelet (logs, exec) at the node's hostname or address, whichever
# resolves first: listen on all of them; only clients with a certificate of the node's CA get in.
readOnlyPort: 0
podLogsDir: $STATE/pod-logs
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: AlwaysAllow}
registerNode: true
maxPods: 40
serializeImagePulls: false
# A shared, busy build machine: no evictions for disk or memory pressure of other work.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
EOF
}

import_image() { # import_image REF: into containerd's k8s.io namespace, unless that image id is there
    local ref="$1" id stamp
    id="$(podman image inspect --format '{{.Id}}' "$ref")"
    stamp="$IMAGES/.imported-$(echo "$ref" | tr '/:' '__')"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$id" ]] && ctr_ images ls -q | grep -qx "$ref"; then
        log "$ref already in containerd"
        return
    fi
    log "importing $ref into containerd"
    # containerd 1.6 can lose a race between its garbage collector (scheduled after the kubelet
    # removed earlier tests' containers) and the unpack of layers this image shares with one
    # already there: "parent snapshot ... does not exist". The import is idempotent: try again.
    local attempt
    for attempt in 1 2 3; do
        if podman save --format docker-archive "$ref" | ctr_ images import --no-unpack=false - >/dev/null; then
            echo "$id" > "$stamp"
            return
        fi
        log "import of $ref failed (attempt $attempt of 3)"
        sleep 2
    done
    die "could not import $ref into containerd"
}

pause_image() {
    podman image exists "$PAUSE_IMAGE" && return
    log "building $PAUSE_IMAGE from $BIN/pause"
    local c
    c="$(buildah from scratch)"
    buildah copy --quiet "$c" "$BIN/pause" /pause >/dev/null
    buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
    buildah commit --quiet "$c" "$PAUSE_IMAGE" >/dev/null
    buildah rm "$c" >/dev/null
}

storage() {
    local name; name="$(node_name)"
    mkdir -p "$STATE/pv"
    {
        cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: sluice-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
EOF
        for i in $(seq 0 $(( PVS - 1 ))); do
            mkdir -p "$STATE/pv/pv-$i"
            cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: sluice-local-$i
spec:
  capacity: {storage: 20Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: sluice-local
  local: {path: $STATE/pv/pv-$i}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [$name]}
EOF
        done
    } | kubectl apply -f - >/dev/null
}

node_ready() {
    [[ "$(kubectl get node "$(node_name)" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

up() {
    local why
    why="$(check)" || { local rc=$?; log "error: this machine cannot run the node: $why"; exit "$rc"; }
    if alive kubelet && alive kube-apiserver && node_ready 2>/dev/null; then
        log "already up"
        echo "$KUBECONFIG_FILE"
        return
    fi
    down_quietly
    mkdir -p "$STATE"
    local ip; ip="$(node_ip)"
    log "starting a node at $ip (API server https://127.0.0.1:$PORT, state $STATE)"
    pki

    spawn etcd "$BIN/etcd" --name=sluice-node --data-dir="$STATE/etcd" \
        --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls="http://127.0.0.1:$((ETCD_PORT + 1))" \
        --initial-advertise-peer-urls="http://127.0.0.1:$((ETCD_PORT + 1))" \
        --initial-cluster="sluice-node=http://127.0.0.1:$((ETCD_PORT + 1))" --unsafe-no-fsync --log-level=warn
    local p="$STATE/pki"
    spawn kube-apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --bind-address=127.0.0.1 --advertise-address="$ip" --secure-port="$PORT" --cert-dir="$p" \
        --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
        --authorization-mode=Node,RBAC --service-account-key-file="$p/sa.pub" \
        --service-account-signing-key-file="$p/sa.key" \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true --profiling=false \
        --kubelet-client-certificate="$p/apiserver-kubelet.crt" --kubelet-client-key="$p/apiserver-kubelet.key" \
        --endpoint-reconciler-type=none
    wait_for 120 "the API server" kubectl get --raw /readyz

    spawn kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG_FILE" \
        --authentication-kubeconfig="$KUBECONFIG_FILE" --authorization-kubeconfig="$KUBECONFIG_FILE" \
        --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
        --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
        --cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
        --controllers='*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle' --profiling=false
    spawn kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$KUBECONFIG_FILE" \
        --authentication-kubeconfig="$KUBECONFIG_FILE" --authorization-kubeconfig="$KUBECONFIG_FILE" \
        --bind-address=127.0.0.1 --leader-elect=false --profiling=false

    containerd_config
    spawn containerd containerd --config "$STATE/containerd/config.toml"
    wait_for 60 "containerd" ctr_ version
    pause_image
    import_image "$PAUSE_IMAGE"
    import_image "$(bash "$HERE/build-image.sh")"

    kubelet_config
    spawn kubelet "$BIN/kubelet" --config="$STATE/kubelet/config.yaml" --kubeconfig="$STATE/kubelet.kubeconfig" \
        --root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet/pki" --node-ip="$ip" \
        --hostname-override="$(node_name)"
    wait_for 120 "node $(node_name) Ready" node_ready
    storage
    wait_for 60 "the default service account" kubectl get serviceaccount default -n default
    log "node $(node_name) Ready; kubeconfig $KUBECONFIG_FILE"
    echo "$KUBECONFIG_FILE"
}

# -- down ----------------------------------------------------------------------------------------

stop_pid() { # stop_pid NAME: SIGTERM, then SIGKILL after 20 s
    local name="$1" pid
    [[ -f "$STATE/$name.pid" ]] || return 0
    pid="$(cat "$STATE/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/$name.pid"
}

shims() { # pids of the containerd shims of this node's containerd (their command line names $SOCK)
    local d
    for d in /proc/[0-9]*; do
        { tr '\0' ' ' < "$d/cmdline"; } 2>/dev/null | grep -q -- "-address $SOCK" && echo "${d#/proc/}"
    done
    return 0
}

down_quietly() {
    [[ -d "$STATE" ]] || return 0
    stop_pid kubelet
    if [[ -S "$SOCK" ]] && ctr_ version >/dev/null 2>&1; then
        # Every container and sandbox of the node: killed, deleted (their shims exit with them).
        local id
        for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
        sleep 1
        for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks rm -f "$id" >/dev/null 2>&1 || true; done
        for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers rm "$id" >/dev/null 2>&1 || true; done
    fi
    stop_pid containerd
    local pid
    for pid in $(shims); do kill -KILL "$pid" 2>/dev/null || true; done
    stop_pid kube-scheduler
    stop_pid kube-controller-manager
    stop_pid kube-apiserver
    stop_pid etcd
    # Mounts the kubelet and containerd made under the state directory (volumes, rootfs, shm).
    local m
    for m in $(awk -v s="$STATE" 'index($2, s) == 1 {print $2}' /proc/mounts | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    # A container whose shim died first would outlive it: whatever still runs in the pods'
    # cgroups (the kubelet made them, so all of it is the node's) is killed; then the cgroups go.
    for pid in $(cat /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
                     /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs \
                     2>/dev/null | sort -u); do
        kill -KILL "$pid" 2>/dev/null || true
    done
    sleep 0.5
    for m in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/unified/kubepods; do
        if [[ -d "$m" ]]; then find "$m" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
    done
    rm -rf "$STATE"
}

down() {
    down_quietly
    log "down: nothing of the node runs; state removed (images kept in $IMAGES)"
}

status() {
    alive kubelet && alive kube-apiserver && node_ready
}

image() { # image NAME: build-image.sh NAME, then into the node's containerd
    [[ -n "${1:-}" ]] || { echo "usage: $0 image sluice|spark" >&2; exit 2; }
    status 2>/dev/null || die "the node is not up (tools/k8s-node/node.sh up)"
    local ref
    ref="$(bash "$HERE/build-image.sh" "$1")"
    import_image "$ref"
    echo "$ref"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    check) check ;;
    kubeconfig) echo "$KUBECONFIG_FILE" ;;
    image) image "${2:-}" ;;
    *) echo "usage: $0 up|down|status|check|kubeconfig|image NAME" >&2; exit 2 ;;
esac
