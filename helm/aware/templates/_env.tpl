{{/* Service-specific environment (configuration keys AWARE_<SECTION>__<KEY>). */}}

{{- define "aware.env.controller" -}}
{{- with .Values.controller.watchNamespace }}
- name: AWARE_CONTROLLER__NAMESPACE
  value: {{ . | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.controller.resyncSeconds) }}
- name: AWARE_CONTROLLER__RESYNC_SECONDS
  value: {{ .Values.controller.resyncSeconds | quote }}
{{- end }}
- name: AWARE_CONTROLLER__LEADER_ELECTION__MODE
  value: {{ ternary "on" "off" .Values.controller.leaderElection | quote }}
- name: AWARE_CONTROLLER__LEADER_ELECTION__LEASE_NAME
  value: {{ printf "%s-controller" (include "aware.fullname" .) | quote }}
# The Lease's namespace and this replica's identity in it.
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}

{{- define "aware.env.collector" -}}
- name: AWARE_COLLECTOR__SOURCE
  value: prometheus
- name: AWARE_COLLECTOR__PROMETHEUS__URL
  value: {{ .Values.collector.prometheus.url | quote }}
{{- end }}

{{- define "aware.env.actuator" -}}
- name: AWARE_ACTUATOR__SINK
  value: kubernetes
{{- end }}

{{- define "aware.env.recorder" -}}
{{ include "aware.trajectoryStoreEnv" . }}
{{- end }}

{{- define "aware.env.lifecycleMonitor" -}}
{{- end }}

{{- define "aware.env.trainer" -}}
{{ include "aware.trajectoryStoreEnv" . }}
- name: AWARE_MODEL_STORE__BACKEND
  value: {{ .Values.modelStore.backend | quote }}
{{- end }}

{{- /* This pod's shard of a per-target service (`.` = the service's values): its index from the
StatefulSet pod-index label, the count from `shards`. */ -}}
{{- define "aware.shardEnv" -}}
- name: AWARE_SHARD__INDEX
  valueFrom:
    fieldRef:
      fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
- name: AWARE_SHARD__COUNT
  value: {{ .shards | quote }}
{{- end }}

{{- define "aware.env.recommender" -}}
- name: AWARE_MODEL_STORE__BACKEND
  value: {{ .Values.modelStore.backend | quote }}
{{- end }}
