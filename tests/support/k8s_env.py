"""A real Kubernetes control plane for tests: etcd and kube-apiserver on loopback, envtest-style.

There is no kubelet, scheduler or controller-manager: objects are stored, validated (OpenAPI
schemas, CEL rules, admission), authorized (RBAC) and watched exactly as in a cluster, but no pod
ever runs and no controller acts on anything (a StatefulSet creates no pods, a deleted namespace
stays Terminating). Tests that need "pods" create Pod objects and set their status themselves.

What :class:`TestControlPlane` starts, in a work directory of its own:

* etcd, listening on a free loopback port, data in ``<workdir>/etcd`` (``--unsafe-no-fsync``:
  the data is thrown away after the run, and fsync on a shared disk is what makes etcd slow;
  ``etcd_fsync=True`` keeps fsync on, for measurements whose write latencies must be real:
  bench/metadata_scale.py);
* kube-apiserver on ``https://127.0.0.1:<free port>`` with

  - a CA made for this run (:mod:`sluice.tls`, the brokers' own certificate code) and a serving certificate for
    127.0.0.1/localhost signed by it;
  - client-certificate authentication against that CA: the kubeconfig's user is
    ``sluice-test-admin`` in group ``system:masters``; :meth:`TestControlPlane.user_kubeconfig`
    makes certificates for other users and groups;
  - ``--authorization-mode=RBAC``: anyone but system:masters gets only what RBAC grants;
  - service-account token signing keys and an issuer, so the TokenRequest API works
    (``kubectl create token``) and :meth:`KubeCluster.service_account_kubeconfig` can act as a
    service account, as the operator does in a cluster;
  - the ServiceAccount admission plugin off (as in controller-runtime's envtest): without the
    controller-manager no namespace gets its ``default`` service account, and pods would be
    refused for lack of it.

``start()`` waits for ``/readyz`` (bounded), then writes a kubeconfig (certificates embedded, so
the file stands alone). ``stop()`` stops the API server, then etcd, and removes nothing: the logs
(``kube-apiserver.log``, ``etcd.log``) stay in the work directory for a failed run's report.

The binaries come from ``tools/k8s-testenv/build.sh`` (built from the Go module proxy and cached
in ``$SLUICE_K8S_CACHE/bin``, default ``~/.cache/sluice-k8s/bin``); :func:`find_bin_dir` says
where, and fails with the command to run when they are missing.

:class:`ExistingCluster` wraps any other cluster given by a kubeconfig (a kind cluster, say), with
the same :class:`KubeCluster` interface, so a test suite runs against either.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from sluice import tls
from sluice.testing._net import free_port, poll_until
from sluice.testing._process import ManagedProcess

BINARIES = ("kube-apiserver", "etcd", "kubectl", "helm")
BUILD_SCRIPT = "tools/k8s-testenv/build.sh"
ADMIN_USER = "sluice-test-admin"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, or a command against it failed."""


def cache_dir() -> Path:
    """``$SLUICE_K8S_CACHE``, else ``~/.cache/sluice-k8s``: where build.sh puts ``bin/``."""
    env = os.environ.get("SLUICE_K8S_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "sluice-k8s"


def find_bin_dir(required: Sequence[str] = BINARIES) -> Path:
    """The directory holding the control plane's binaries, checked; else a :class:`ControlPlaneError`.

    ``$SLUICE_K8S_BIN`` names it directly; otherwise it is ``cache_dir()/bin``.
    """
    env = os.environ.get("SLUICE_K8S_BIN")
    bin_dir = Path(env) if env else cache_dir() / "bin"
    missing = [name for name in required if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise ControlPlaneError(
            f"missing {', '.join(missing)} in {bin_dir}: build them with `bash {BUILD_SCRIPT}` "
            "(from the Go module proxy; 10 to 30 min cold on 2 cores, cached afterwards), "
            "or point SLUICE_K8S_BIN at a directory that has them"
        )
    return bin_dir


# -- certificates ------------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def kubeconfig_document(
    server: str,
    ca_pem: bytes,
    user: str,
    *,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> str:
    """A one-cluster, one-user kubeconfig (JSON, which kubectl, helm and client libraries read as YAML)."""
    user_entry: dict[str, str] = {}
    if cert_pem is not None and key_pem is not None:
        user_entry = {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}
    elif token is not None:
        user_entry = {"token": token}
    else:
        raise ValueError("a kubeconfig user needs a client certificate and key, or a token")
    context: dict[str, str] = {"cluster": "sluice-test", "user": user}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "sluice-test", "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}
        ],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": "sluice-test", "context": context}],
        "current-context": "sluice-test",
        "preferences": {},
    }
    return json.dumps(doc, indent=2) + "\n"


# -- clusters ----------------------------------------------------------------------------------


class KubeCluster:
    """A cluster reachable through a kubeconfig: the interface the Kubernetes tests use.

    ``kubeconfig`` (path), ``server`` (URL), ``kubectl(...)`` and ``helm(...)`` (subprocesses
    against this cluster, text in and out), ``apply(yaml_text)``, ``create_namespace()`` and
    ``service_account_kubeconfig()`` to act as a service account.
    """

    def __init__(self, kubeconfig: Path, server: str, bin_dir: Path | None, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.server = server
        self.bin_dir = bin_dir
        self.workdir = workdir
        self._namespaces = 0

    # -- tools -------------------------------------------------------------------------------

    def tool(self, name: str) -> str:
        """Path of ``kubectl`` or ``helm``: from the bin directory, else from PATH."""
        if self.bin_dir is not None and os.access(self.bin_dir / name, os.X_OK):
            return str(self.bin_dir / name)
        found = shutil.which(name)
        if found is None:
            raise ControlPlaneError(f"{name} not found (neither in {self.bin_dir} nor on PATH); see {BUILD_SCRIPT}")
        return found

    def _run(
        self, argv: list[str], *, input: str | None, check: bool, timeout: float, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                argv,
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, **(env or {})},
            )
        except subprocess.TimeoutExpired as exc:
            raise ControlPlaneError(f"`{' '.join(argv)}` did not finish within {timeout} s") from exc
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"`{' '.join(argv)}` exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl --kubeconfig=... ARGS``; with ``check`` a non-zero exit raises :class:`ControlPlaneError`."""
        argv = [self.tool("kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        return self._run(argv, input=input, check=check, timeout=timeout)

    def kubectl_json(self, *args: str, kubeconfig: Path | None = None, timeout: float = 60.0) -> dict[str, object]:
        """``kubectl ARGS -o json``, parsed."""
        out = self.kubectl(*args, "-o", "json", kubeconfig=kubeconfig, timeout=timeout).stdout
        doc = json.loads(out)
        if not isinstance(doc, dict):
            raise ControlPlaneError(f"kubectl {' '.join(args)} -o json gave no object: {out[:200]}")
        return doc

    def helm(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 180.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``helm --kubeconfig=... ARGS`` with helm's cache, config and data kept in the work directory."""
        home = self.workdir / "helm"
        env = {
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        argv = [self.tool("helm"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        return self._run(argv, input=input, check=check, timeout=timeout, env=env)

    def apply(self, manifest: str, *, namespace: str | None = None, server_side: bool = False) -> str:
        """``kubectl apply -f -`` of YAML or JSON text; returns kubectl's output."""
        args = ["apply", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        if server_side:
            args += ["--server-side", "--field-manager=sluice-tests"]
        return self.kubectl(*args, input=manifest).stdout

    def create_namespace(self, prefix: str = "sluice-test") -> str:
        """A new namespace with a unique name (``PREFIX-<n>-<random>``); returns its name."""
        self._namespaces += 1
        name = f"{prefix}-{self._namespaces}-{os.urandom(3).hex()}"[:63]
        self.kubectl("create", "namespace", name)
        return name

    def service_account_kubeconfig(self, namespace: str, name: str, *, create: bool = True) -> Path:
        """A kubeconfig that acts as service account ``namespace/name`` (a TokenRequest token, 1 h).

        The account is created first unless ``create`` is false. It may do only what RBAC grants
        it, which is how the tests check the chart's and the operator's roles.
        """
        if create:
            self.kubectl("create", "serviceaccount", name, "-n", namespace)
        token = self.kubectl("create", "token", name, "-n", namespace, "--duration=1h").stdout.strip()
        cfg = self.kubectl_json("config", "view", "--raw", "--minify")
        clusters = cfg.get("clusters")
        if not isinstance(clusters, list) or not clusters:
            raise ControlPlaneError("the kubeconfig has no cluster")
        cluster = clusters[0]["cluster"]
        ca = base64.b64decode(cluster["certificate-authority-data"]) if "certificate-authority-data" in cluster else b""
        path = self.workdir / f"kubeconfig-sa-{namespace}-{name}"
        text = kubeconfig_document(
            cluster["server"], ca, f"system:serviceaccount:{namespace}:{name}", token=token, namespace=namespace
        )
        path.write_text(text)
        path.chmod(0o600)
        return path

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until ``kubectl get --raw /readyz`` answers ok (bounded)."""

        def ready() -> bool:
            proc = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10.0)
            return proc.returncode == 0 and proc.stdout.strip() == "ok"

        if not poll_until(ready, timeout=timeout, interval=0.5, max_interval=2.0):
            raise ControlPlaneError(f"{self.server} not ready within {timeout} s")


class ExistingCluster(KubeCluster):
    """A cluster started by someone else (kind, a real one), given by its kubeconfig; nothing to stop."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        bin_dir: Path | None
        try:
            bin_dir = find_bin_dir(("kubectl", "helm"))
        except ControlPlaneError:
            bin_dir = None  # kubectl and helm from PATH
        super().__init__(kubeconfig, "", bin_dir, workdir)
        cfg = self.kubectl_json("config", "view", "--minify")
        clusters = cfg.get("clusters")
        if not isinstance(clusters, list) or not clusters:
            raise ControlPlaneError(f"{kubeconfig} names no cluster in its current context")
        self.server = str(clusters[0]["cluster"]["server"])
        self.wait_ready()

    def stop(self) -> None:
        """Nothing: the cluster is not ours."""

    def __enter__(self) -> ExistingCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TestControlPlane(KubeCluster):
    """etcd + kube-apiserver on loopback, started by ``start()`` (or ``with``) and stopped by ``stop()``.

    Attributes once started: ``kubeconfig`` (admin, system:masters), ``server``
    (``https://127.0.0.1:PORT``), ``ca`` (:class:`CertificateAuthority`), ``workdir``.
    """

    __test__ = False  # a class named Test... is not a pytest test class

    def __init__(
        self,
        workdir: Path,
        *,
        bin_dir: Path | None = None,
        extra_apiserver_args: Sequence[str] = (),
        etcd_fsync: bool = False,
    ) -> None:
        bin_dir = bin_dir if bin_dir is not None else find_bin_dir()
        self.etcd_fsync = etcd_fsync
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir / "kubeconfig", "", bin_dir, workdir)
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.ca = tls.generate_ca("sluice-test-ca", validity_days=2)  # a CA made for this control plane
        self.etcd: ManagedProcess | None = None
        self.apiserver: ManagedProcess | None = None
        self.etcd_url = ""

    # -- files -------------------------------------------------------------------------------

    def _write(self, name: str, data: bytes, mode: int = 0o600) -> Path:
        path = self.workdir / "pki" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        return path

    def user_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig for ``user`` in ``groups``, by a client certificate this control plane's CA signs."""
        pair = tls.issue(self.ca, user, organizations=groups)
        cert, key = pair.cert_pem, pair.key_pem
        path = self.workdir / f"kubeconfig-user-{user.replace(':', '_')}"
        path.write_text(kubeconfig_document(self.server, self.ca.cert_pem, user, cert_pem=cert, key_pem=key))
        path.chmod(0o600)
        return path

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Start etcd, then kube-apiserver; wait (bounded by ``timeout`` s in all) until it is ready."""
        assert self.bin_dir is not None
        deadline = time.monotonic() + timeout
        host = "127.0.0.1"
        etcd_port, peer_port, api_port = free_port(host), free_port(host), free_port(host)
        self.etcd_url = f"http://{host}:{etcd_port}"
        self.etcd = ManagedProcess(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=sluice-test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://{host}:{peer_port}",
                f"--initial-advertise-peer-urls=http://{host}:{peer_port}",
                f"--initial-cluster=sluice-test=http://{host}:{peer_port}",
                "--initial-cluster-state=new",
                *([] if self.etcd_fsync else ["--unsafe-no-fsync"]),
                "--log-level=warn",
            ],
            self.workdir / "etcd.log",
        )
        self.etcd.start()
        try:
            self._wait_etcd(deadline)
            self._start_apiserver(host, api_port, deadline)
        except BaseException:
            self.stop()
            raise

    def _wait_etcd(self, deadline: float) -> None:
        assert self.etcd is not None
        etcd = self.etcd

        def healthy() -> bool:
            if not etcd.is_alive():
                return True  # reported below
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                    return bool(json.loads(resp.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        ok = poll_until(healthy, timeout=max(deadline - time.monotonic(), 0.0), interval=0.1, max_interval=0.5)
        if not etcd.is_alive():
            raise ControlPlaneError(f"etcd exited with code {etcd.returncode}:\n{etcd.log_tail()}")
        if not ok:
            raise ControlPlaneError(f"etcd not healthy at {self.etcd_url}:\n{etcd.log_tail()}")

    def _start_apiserver(self, host: str, port: int, deadline: float) -> None:
        assert self.bin_dir is not None
        ca_file = self._write("ca.crt", self.ca.cert_pem, 0o644)
        serving = tls.issue(
            self.ca,
            "kube-apiserver",
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ip_addresses=[host, "10.0.0.1"],
        )
        cert_file = self._write("apiserver.crt", serving.cert_pem, 0o644)
        key_file = self._write("apiserver.key", serving.key_pem)
        sa_key = ec.generate_private_key(ec.SECP256R1())
        sa_key_file = self._write("sa.key", _pem_key(sa_key))
        sa_pub_file = self._write(
            "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            0o644,
        )
        admin = tls.issue(self.ca, ADMIN_USER, organizations=["system:masters"])
        admin_cert_file = self._write("admin.crt", admin.cert_pem, 0o644)
        admin_key_file = self._write("admin.key", admin.key_pem)

        self.server = f"https://{host}:{port}"
        self.apiserver = ManagedProcess(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--tls-cert-file={cert_file}",
                f"--tls-private-key-file={key_file}",
                f"--client-ca-file={ca_file}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={sa_pub_file}",
                f"--service-account-signing-key-file={sa_key_file}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--profiling=false",
                *self.extra_apiserver_args,
            ],
            self.workdir / "kube-apiserver.log",
        )
        self.apiserver.start()
        self._wait_apiserver(ca_file, admin_cert_file, admin_key_file, deadline)
        self.kubeconfig.write_text(
            kubeconfig_document(
                self.server, self.ca.cert_pem, ADMIN_USER, cert_pem=admin.cert_pem, key_pem=admin.key_pem
            )
        )
        self.kubeconfig.chmod(0o600)

    def _wait_apiserver(self, ca_file: Path, cert_file: Path, key_file: Path, deadline: float) -> None:
        """Until ``GET /readyz`` as the admin answers 200 ``ok``, the process dies, or the deadline."""
        assert self.apiserver is not None
        apiserver = self.apiserver
        ctx = ssl.create_default_context(cafile=str(ca_file))
        ctx.load_cert_chain(str(cert_file), str(key_file))
        last_error = ["no answer yet"]

        def ready() -> bool:
            if not apiserver.is_alive():
                return True  # reported below
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", timeout=5, context=ctx) as resp:
                    body = resp.read().decode(errors="replace").strip()
                    last_error[0] = f"HTTP {resp.status}: {body[:200]}"
                    return bool(resp.status == 200 and body == "ok")
            except urllib.error.HTTPError as exc:
                last_error[0] = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[-500:]}"
            except OSError as exc:
                last_error[0] = repr(exc)
            return False

        ok = poll_until(ready, timeout=max(deadline - time.monotonic(), 0.0), interval=0.2, max_interval=1.0)
        if not apiserver.is_alive():
            raise ControlPlaneError(f"kube-apiserver exited with code {apiserver.returncode}:\n{apiserver.log_tail()}")
        if not ok:
            raise ControlPlaneError(
                f"kube-apiserver at {self.server} not ready in time (last: {last_error[0]}):\n{apiserver.log_tail()}"
            )

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd (SIGTERM, bounded wait, SIGKILL). Idempotent."""
        if self.apiserver is not None:
            self.apiserver.stop(timeout=15.0)
        if self.etcd is not None:
            self.etcd.stop(timeout=15.0)

    def __enter__(self) -> TestControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
