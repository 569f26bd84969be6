{{/* Chart name, truncated to 63 characters (a DNS label). */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, with the chart name unless it contains it. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{/* Selector labels; pass (dict "ctx" $ "component" "broker"). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sluice.broker.fullname" -}}
{{- printf "%s-broker" (include "sluice.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The headless Service that gives each broker pod its stable DNS name. */}}
{{- define "sluice.broker.headless" -}}
{{- printf "%s-headless" (include "sluice.broker.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.operator.fullname" -}}
{{- printf "%s-operator" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The brokers' settings (a JSON object): replication defaults that fit the broker count (3 and 2, or
fewer with fewer brokers), the coordinators' internal-topic settings, then broker.config on top.
*/}}
{{- define "sluice.broker.config" -}}
{{- $n := int .Values.broker.replicas }}
{{- $c := dict }}
{{- $_ := set $c "default.replication.factor" (toString (min 3 $n)) }}
{{- $_ := set $c "min.insync.replicas" (toString (max 1 (min 2 (sub $n 1)))) }}
{{- $_ := set $c "transaction.state.log.num.partitions" (toString .Values.coordinators.transaction.partitions) }}
{{- $_ := set $c "transaction.state.log.replication.factor" (toString (min .Values.coordinators.transaction.replicationFactor $n)) }}
{{- $_ := set $c "offsets.topic.num.partitions" (toString .Values.coordinators.group.partitions) }}
{{- $_ := set $c "offsets.topic.replication.factor" (toString (min .Values.coordinators.group.replicationFactor $n)) }}
{{- range $k, $v := .Values.coordinators.transaction.settings }}{{ $_ := set $c $k (toString $v) }}{{ end }}
{{- range $k, $v := .Values.coordinators.group.settings }}{{ $_ := set $c $k (toString $v) }}{{ end }}
{{- if .Values.broker.authorizer.enabled }}
{{- $_ := set $c "authorizer.enabled" "true" }}
{{- $supers := list }}
{{- if and .Values.operator.enabled (eq .Values.broker.clientAuth.listener "mtls") }}
{{- $supers = append $supers "User:sluice-operator" }}
{{- else if .Values.operator.enabled }}
{{- $supers = append $supers (printf "ServiceAccount:%s:%s" .Release.Namespace (include "sluice.operator.fullname" .)) }}
{{- end }}
{{- $_ := set $c "super.users" (join ";" (concat $supers .Values.broker.authorizer.superUsers)) }}
{{- end }}
{{- range $k, $v := .Values.broker.config }}{{ $_ := set $c $k (toString $v) }}{{ end }}
{{- toJson $c }}
{{- end }}

{{/*
KUBERNETES_SERVICE_HOST/PORT for host-network pods that cannot reach the "kubernetes" Service
(hostNetwork.apiServer.host set); nothing otherwise.
*/}}
{{- define "sluice.apiServerEnv" -}}
{{- if and .Values.hostNetwork.enabled .Values.hostNetwork.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.hostNetwork.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.hostNetwork.apiServer.port | quote }}
{{- end }}
{{- end }}

{{/*
A host-network broker's probe (pass the gRPC health service name): the standard gRPC health
check against this pod's own port, NODE_IP:(broker.port + ordinal), as an exec probe, since a
pod template's grpc probe has one fixed port for every pod.
*/}}
{{- define "sluice.broker.execProbe" -}}
exec:
  command:
    - python
    - -c
    - |-
      import os, sys, grpc
      from grpc_health.v1 import health_pb2 as pb, health_pb2_grpc as rpc
      ip = os.environ["HOST_IP"]
      port = int(os.environ["SLUICE_GRPC_PORT_BASE"]) + int(os.environ["SLUICE_BROKER_ID"])
      target = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
      if os.environ.get("SLUICE_CLIENT_LISTENER", "plaintext") == "plaintext":
          channel = grpc.insecure_channel(target)
      else:  # TLS: the broker's certificate, checked against the cluster CA (health needs no token)
          ca = open("/etc/sluice/broker-tls/ca.crt", "rb").read()
          options = [("grpc.ssl_target_name_override", "sluice-broker")]
          creds = grpc.ssl_channel_credentials(ca)
          if os.environ["SLUICE_CLIENT_LISTENER"] == "mtls":  # and a client certificate: its own
              own = "/etc/sluice/broker-tls/broker-" + os.environ["SLUICE_BROKER_ID"]
              creds = grpc.ssl_channel_credentials(ca, open(own + ".key", "rb").read(), open(own + ".crt", "rb").read())
          channel = grpc.secure_channel(target, creds, options=options)
      with channel:
          reply = rpc.HealthStub(channel).Check(pb.HealthCheckRequest(service=sys.argv[1]), timeout=3)
      sys.exit(0 if reply.status == pb.HealthCheckResponse.SERVING else 1)
    - {{ . | quote }}
{{- end }}

{{- /*
Certificates (docs/security.md, "Certificate lifecycle"): who makes the cluster CA and the broker
certificates. "operator" (the default): the operator creates and renews them in Secrets; "helm":
Helm generates a CA and one broker certificate once (no renewal). broker.interBroker.tlsSecret,
when set, is a Secret of your own and wins over both.
*/ -}}
{{- define "sluice.certificates.operator" -}}
{{- if and (not .Values.broker.interBroker.tlsSecret) (eq .Values.certificates.managedBy "operator") -}}
{{- if not .Values.operator.enabled -}}
{{- fail "certificates.managedBy=operator needs operator.enabled (or set certificates.managedBy=helm, or broker.interBroker.tlsSecret)" -}}
{{- end -}}
true
{{- else if not (has .Values.certificates.managedBy (list "operator" "helm")) -}}
{{- fail (printf "certificates.managedBy must be operator or helm, not %q" .Values.certificates.managedBy) -}}
{{- end -}}
{{- end -}}

{{- define "sluice.certificates.caSecret" -}}
{{- printf "%s-cluster-ca" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "sluice.certificates.caCertSecret" -}}
{{- printf "%s-cluster-ca-cert" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- /* The Secret whose ca.crt clients (the operator too) verify the brokers with: the CA
certificate Secret (the trust bundle, no key) when the operator makes the certificates, else
the brokers' Secret. */ -}}
{{- define "sluice.certificates.clientCaSecret" -}}
{{- if eq (include "sluice.certificates.operator" .) "true" -}}
{{- include "sluice.certificates.caCertSecret" . -}}
{{- else -}}
{{- include "sluice.certificates.brokerSecret" . -}}
{{- end -}}
{{- end -}}

{{- /* The Secret mounted into the brokers at /etc/sluice/broker-tls. */ -}}
{{- define "sluice.certificates.brokerSecret" -}}
{{- if .Values.broker.interBroker.tlsSecret -}}
{{- .Values.broker.interBroker.tlsSecret -}}
{{- else if eq (include "sluice.certificates.operator" .) "true" -}}
{{- printf "%s-certs" (include "sluice.broker.fullname" .) -}}
{{- else -}}
{{- printf "%s-tls" (include "sluice.broker.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/*
The client listener's mode, checked: token, mtls, tls or plaintext. mtls needs the operator's
clients CA (certificates.managedBy=operator): its certificate is what the brokers verify clients
with, and the operator connects with a certificate of its own from it.
*/}}
{{- define "sluice.broker.clientListener" -}}
{{- $mode := .Values.broker.clientAuth.listener }}
{{- if not (has $mode (list "token" "mtls" "tls" "plaintext")) }}
{{- fail (printf "broker.clientAuth.listener must be \"token\", \"mtls\", \"tls\" or \"plaintext\", not %q" $mode) }}
{{- end }}
{{- if and (eq $mode "mtls") (ne (include "sluice.certificates.operator" .) "true") }}
{{- fail "broker.clientAuth.listener \"mtls\" needs the operator's clients CA: certificates.managedBy=operator (and no broker.interBroker.tlsSecret)" }}
{{- end }}
{{- if and .Values.broker.authorizer.enabled (not (has $mode (list "token" "mtls"))) }}
{{- fail (printf "broker.authorizer.enabled needs broker.clientAuth.listener \"token\" or \"mtls\": with %q every client is User:ANONYMOUS, the operator included (set broker.authorizer.enabled=false too)" $mode) }}
{{- end }}
{{- $mode }}
{{- end }}

{{- /*
The clients CA (docs/security.md, "Client certificates"): the operator makes it when
certificates.clientsCa.enabled, or when the client listener is mtls (which needs it); SluiceUsers
of type tls then get certificates from it.
*/ -}}
{{- define "sluice.certificates.clientsCa" -}}
{{- if eq (include "sluice.certificates.operator" .) "true" -}}
{{- if or .Values.certificates.clientsCa.enabled (eq .Values.broker.clientAuth.listener "mtls") -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.certificates.clientsCaSecret" -}}
{{- printf "%s-clients-ca" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- /* the clients CA's certificate (no key): the brokers' --clients-ca */ -}}
{{- define "sluice.certificates.clientsCaCertSecret" -}}
{{- printf "%s-clients-ca-cert" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- /* the operator's own client certificate (CN sluice-operator) for an mtls listener */ -}}
{{- define "sluice.certificates.operatorClientSecret" -}}
{{- printf "%s-client" (include "sluice.operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end -}}
