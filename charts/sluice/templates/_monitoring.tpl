{{/*
Whether the operator serves its Prometheus metrics: monitoring.operator.enabled, or, when that is
left unset (null), the same as the brokers' (broker.metrics.enabled), so one switch turns every
metrics port of the release off. Renders "true" or "false".
*/}}
{{- define "sluice.operator.metricsEnabled" -}}
{{- if kindIs "invalid" .Values.monitoring.operator.enabled -}}
{{- .Values.broker.metrics.enabled -}}
{{- else -}}
{{- .Values.monitoring.operator.enabled -}}
{{- end -}}
{{- end }}
