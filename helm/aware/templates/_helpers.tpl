{{/* Name of the chart. */}}
{{- define "aware.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every resource name. */}}
{{- define "aware.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "aware.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "aware.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aware
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "recommender"). */}}
{{- define "aware.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aware.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The AWARE-rs image reference. */}}
{{- define "aware.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The NATS identities (files/nats-authorization.conf): one per service, and `watch`. */}}
{{- define "aware.natsIdentities" -}}
collector recommender actuator recorder trainer lifecycle-monitor controller watch
{{- end }}

{{/* The identity a service component runs as. */}}
{{- define "aware.natsIdentityOf" -}}
{{- get (dict "controller" "controller" "metrics-collector" "collector" "actuator" "actuator" "trajectory-recorder" "recorder" "lifecycle-monitor" "lifecycle-monitor" "meta-learner-trainer" "trainer" "recommender" "recommender") . }}
{{- end }}

{{/* The Secret (key `password`) of an identity: dict "root" "identity". */}}
{{- define "aware.natsIdentitySecret" -}}
{{- $existing := get .root.Values.nats.auth.existingSecrets .identity }}
{{- if $existing }}
{{- $existing }}
{{- else }}
{{- printf "%s-nats-%s" (include "aware.fullname" .root) .identity }}
{{- end }}
{{- end }}

{{/* Environment shared by every AWARE-rs service (bus, HTTP endpoint, logging). */}}
{{- define "aware.commonEnv" -}}
- name: AWARE_BUS__URL
  value: {{ printf "nats://%s-nats:4222" (include "aware.fullname" .) | quote }}
- name: AWARE_HTTP__LISTEN
  value: "0.0.0.0:9464"
- name: AWARE_LOG__FORMAT
  value: {{ .Values.logFormat | quote }}
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
- name: AWARE_ACTORS__RETIRE_AFTER_SECS
  value: {{ .Values.retireAfterSeconds | quote }}
{{- $partitions := int .Values.nats.jetstream.capturePartitions }}
{{- if gt $partitions 1 }}
# The capture in partitions (docs/adr/0024-capture-partitions.md).
- name: AWARE_BUS__JETSTREAM__PARTITIONS
  value: {{ $partitions | quote }}
{{- end }}
{{- if gt (int .Values.nats.replicas) 1 }}
# A NATS cluster: every stream and bucket with a copy per server, and publishes that go on only
# once stored (docs/operations.md#across-machines).
- name: AWARE_BUS__JETSTREAM__REPLICAS
  value: {{ .Values.nats.replicas | quote }}
- name: AWARE_BUS__JETSTREAM__ACK_PUBLISHES
  value: "true"
- name: AWARE_MODEL_STORE__REPLICAS
  value: {{ .Values.nats.replicas | quote }}
{{- end }}
{{- end }}

{{/* The trajectory store (QuestDB), read by the recorder and the trainer (`[trajectory_store]`). */}}
{{- define "aware.trajectoryStoreEnv" -}}
- name: AWARE_TRAJECTORY_STORE__BACKEND
  value: questdb
- name: AWARE_TRAJECTORY_STORE__QUESTDB_URL
  value: {{ printf "http://%s-questdb:9000" (include "aware.fullname" .) | quote }}
{{- /* QuestDB cannot delete rows per target: the recorder's retention and forgetting are off with it. */}}
- name: AWARE_TRAJECTORY_STORE__KEEP_TRANSITIONS
  value: "0"
- name: AWARE_TRAJECTORY_STORE__FORGET_AFTER_SECS
  value: "0"
{{- end }}

{{/* Pod-level security context of the AWARE-rs services. */}}
{{- define "aware.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level security context of every container of the chart. */}}
{{- define "aware.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Prometheus scrape annotations of the service pods. */}}
{{- define "aware.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: "9464"
prometheus.io/path: /metrics
{{- end }}

{{/* Scheduling settings shared by every pod. */}}
{{- define "aware.scheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The container and volumes of one AWARE-rs service pod:
(dict "root" $ "component" "actuator" "binary" "aware-actuator" "values" .Values.actuator
      "env" "<extra env YAML>")
*/}}
{{- define "aware.servicePodSpec" -}}
{{- $root := .root -}}
enableServiceLinks: false
securityContext:
  {{- include "aware.podSecurityContext" $root | nindent 2 }}
terminationGracePeriodSeconds: 30
{{- with include "aware.scheduling" $root | trim }}
{{ . }}
{{- end }}
containers:
  - name: {{ .component }}
    image: {{ include "aware.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command: ["/usr/local/bin/{{ .binary }}"]
    workingDir: /data
    env:
      {{- include "aware.commonEnv" $root | trim | nindent 6 }}
      {{- if $root.Values.nats.auth.enabled }}
      {{- $identity := include "aware.natsIdentityOf" .component }}
      # This service's own NATS identity and its subject permissions (`aware nats-config`).
      - name: AWARE_BUS__AUTH__USER
        value: {{ $identity | quote }}
      - name: AWARE_BUS__AUTH__PASSWORD_FILE
        value: /etc/aware/nats/password
      - name: AWARE_BUS__INBOX_PREFIX
        value: {{ printf "_INBOX_%s" ($identity | replace "-" "_") | quote }}
      {{- end }}
      {{- with .env }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with .values.extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    ports:
      - name: metrics
        containerPort: 9464
        protocol: TCP
    livenessProbe:
      httpGet:
        path: /healthz
        port: metrics
      initialDelaySeconds: 5
      periodSeconds: 10
      failureThreshold: 3
    readinessProbe:
      httpGet:
        path: /readyz
        port: metrics
      periodSeconds: 5
      failureThreshold: 3
    resources:
      {{- toYaml .values.resources | nindent 6 }}
    securityContext:
      {{- include "aware.containerSecurityContext" $root | nindent 6 }}
    volumeMounts:
      - name: data
        mountPath: /data
      - name: tmp
        mountPath: /tmp
      {{- if $root.Values.nats.auth.enabled }}
      - name: nats-credentials
        mountPath: /etc/aware/nats
        readOnly: true
      {{- end }}
volumes:
  - name: data
    emptyDir: {}
  - name: tmp
    emptyDir:
      medium: Memory
      sizeLimit: 64Mi
  {{- if $root.Values.nats.auth.enabled }}
  - name: nats-credentials
    secret:
      secretName: {{ include "aware.natsIdentitySecret" (dict "root" $root "identity" (include "aware.natsIdentityOf" .component)) }}
      defaultMode: 0440
      items:
        - key: password
          path: password
  {{- end }}
{{- end }}
