{{/*
The Kafka-protocol listener of the brokers (kafka.enabled; docs/kafka-compatibility.md and
docs/kubernetes.md, "Kafka clients"). The StatefulSet renders its flags; these helpers refuse
values that would start brokers that cannot work, with a message naming the values:

- a client listener mode the Kafka listener cannot follow: it is secured as the gRPC client port
  is (plaintext, tls, mtls: the same certificate, clients CA and ACLs; token: SASL_SSL with
  OAUTHBEARER, the same ServiceAccount tokens), so only an unknown mode is refused
  (broker.clientAuth is read only where it exists);
- a port another listener of the release already holds. On a pod network every pod has its own
  ports, so kafka.port must differ from the broker's client, inter-broker and metrics ports. On
  the host network broker N takes hostNetwork.kafkaPortBase + N on its node, so that range must
  miss every other range of per-broker ports there and the operator's ports (it runs on the host
  network too).
*/}}
{{- define "sluice.kafka.check" -}}
{{- if .Values.kafka.enabled }}
{{- $b := .Values.broker }}
{{- /* Read defensively: broker.clientAuth is the client-security values' key. */}}
{{- $listener := "plaintext" }}
{{- if and (hasKey $b "clientAuth") (kindIs "map" $b.clientAuth) $b.clientAuth.listener }}
{{- $listener = toString $b.clientAuth.listener }}
{{- end }}
{{- if not (has $listener (list "plaintext" "tls" "mtls" "token")) }}
{{- fail (printf "kafka.enabled needs broker.clientAuth.listener \"plaintext\", \"tls\", \"mtls\" or \"token\", not %q: the Kafka listener is secured as the client listener is (docs/kafka-compatibility.md)" $listener) }}
{{- end }}
{{- $n := int .Values.broker.replicas }}
{{- if .Values.hostNetwork.enabled }}
{{- $k := int .Values.hostNetwork.kafkaPortBase }}
{{- $taken := list (list "the brokers' client ports (broker.port + ordinal)" (int .Values.broker.port) $n) }}
{{- $taken = append $taken (list "the inter-broker ports (hostNetwork.interBrokerPortBase + ordinal)" (int .Values.hostNetwork.interBrokerPortBase) $n) }}
{{- if .Values.broker.metrics.enabled }}
{{- $taken = append $taken (list "the metrics ports (broker.metrics.port + ordinal)" (int .Values.broker.metrics.port) $n) }}
{{- end }}
{{- if .Values.operator.enabled }}
{{- $taken = append $taken (list "the operator's health port (operator.healthPort)" (int .Values.operator.healthPort) 1) }}
{{- if eq (include "sluice.operator.metricsEnabled" .) "true" }}
{{- $taken = append $taken (list "the operator's metrics port (monitoring.operator.port)" (int .Values.monitoring.operator.port) 1) }}
{{- end }}
{{- end }}
{{- range $taken }}
{{- $start := index . 1 }}
{{- $end := add $start (index . 2) }}
{{- if and (lt $k $end) (lt $start (add $k $n)) }}
{{- $held := ternary (printf "%d" $start) (printf "%d-%d" $start (sub $end 1)) (eq (index . 2) 1) }}
{{- fail (printf "hostNetwork.kafkaPortBase %d: the Kafka ports %d-%d (one per broker on the host network) overlap %s, %s: choose another hostNetwork.kafkaPortBase" $k $k (sub (add $k $n) 1) (index . 0) $held) }}
{{- end }}
{{- end }}
{{- else }}
{{- $k := int .Values.kafka.port }}
{{- $taken := dict "broker.port" $b.port "broker.interBroker.port" $b.interBroker.port }}
{{- if $b.metrics.enabled }}
{{- $_ := set $taken "broker.metrics.port" $b.metrics.port }}
{{- end }}
{{- if and (hasKey $b "clientAuth") (kindIs "map" $b.clientAuth) $b.clientAuth.healthPort }}
{{- $_ := set $taken "broker.clientAuth.healthPort" $b.clientAuth.healthPort }}
{{- end }}
{{- range $name, $port := $taken }}
{{- if eq $k (int $port) }}
{{- fail (printf "kafka.port %d is %s too: choose another kafka.port" $k $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Broker N's Kafka address as clients are told it on a pod network (the host network's is NODE:port). */}}
{{- define "sluice.kafka.advertise" -}}
$(POD_NAME).{{ include "sluice.broker.headless" . }}.$(POD_NAMESPACE).svc.{{ .Values.kafka.clusterDomain }}:{{ .Values.kafka.port }}
{{- end }}
