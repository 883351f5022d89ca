{{/*
Names.

The host StatefulSet is named "<fullname>" and its pods "<fullname>-<ordinal>".
Those pod names ARE the server ids (LOGHOST_SERVER_ID), which name each host's
dirty log "dirty/<server-id>/" in the store. Changing the release name,
nameOverride or fullnameOverride of an existing installation therefore orphans
every dirty log: never do it (see docs/OPERATIONS.md).

fullname is capped at 42 characters so that "<fullname>-compactor" stays within
the 52 characters a StatefulSet name may have (its pods' controller-revision-hash
label appends 11 characters and must fit in 63).
*/}}
{{- define "loghost.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 42 | trimSuffix "-" }}
{{- end }}

{{- define "loghost.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Host StatefulSet name = prefix of every server id. */}}
{{- define "loghost.host.name" -}}
{{- include "loghost.fullname" . }}
{{- end }}

{{/* Headless service giving each host pod a stable DNS name. */}}
{{- define "loghost.host.headless" -}}
{{- printf "%s-headless" (include "loghost.fullname" .) }}
{{- end }}

{{- define "loghost.compactor.name" -}}
{{- printf "%s-compactor" (include "loghost.fullname" .) }}
{{- end }}

{{- define "loghost.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "loghost.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "loghost.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels. */}}
{{- define "loghost.labels" -}}
helm.sh/chart: {{ include "loghost.chart" . }}
app.kubernetes.io/name: {{ include "loghost.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: loghost
{{- end }}

{{- define "loghost.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loghost.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "loghost.host.selectorLabels" -}}
{{ include "loghost.selectorLabels" . }}
app.kubernetes.io/component: host
{{- end }}

{{- define "loghost.compactor.selectorLabels" -}}
{{ include "loghost.selectorLabels" . }}
app.kubernetes.io/component: compactor
{{- end }}

{{/* The compactor selector as a label-selector string (k=v,...), for the supervisor's pod list. */}}
{{- define "loghost.compactor.labelSelector" -}}
{{- $labels := include "loghost.compactor.selectorLabels" . | fromYaml }}
{{- $parts := list }}
{{- range $k := keys $labels | sortAlpha }}
{{- $parts = append $parts (printf "%s=%v" $k (get $labels $k)) }}
{{- end }}
{{- join "," $parts }}
{{- end }}

{{/*
The label the client Service additionally selects on. Every host pod starts
with it; an operator draining a host before scale-in overwrites it
(kubectl label pod <pod> loghost/serving=false --overwrite) so the pod leaves
the client Service but keeps its headless DNS name, its dirty log and its place
in the compactors' host list.
*/}}
{{- define "loghost.servingLabel" -}}
loghost/serving: "true"
{{- end }}

{{/* Image reference: digest wins over tag; tag defaults to the chart's appVersion. */}}
{{- define "loghost.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Per-pod URL of host <ordinal>: its stable DNS name through the headless service. */}}
{{- define "loghost.host.podURL" -}}
{{- $root := index . 0 -}}
{{- $ordinal := index . 1 -}}
{{- printf "http://%s-%d.%s.%s.svc.%s:%d" (include "loghost.host.name" $root) (int $ordinal) (include "loghost.host.headless" $root) $root.Release.Namespace $root.Values.clusterDomain (int $root.Values.host.port) }}
{{- end }}

{{/* Comma-separated per-pod URLs of every host pod (what compactors pull dirty sets from). */}}
{{- define "loghost.host.allURLs" -}}
{{- $urls := list }}
{{- range $i := until (int .Values.host.replicas) }}
{{- $urls = append $urls (include "loghost.host.podURL" (list $ $i)) }}
{{- end }}
{{- range .Values.compactor.extraHosts }}
{{- $urls = append $urls . }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* Comma-separated compactor member ids for static membership of a StatefulSet: its pod names. */}}
{{- define "loghost.compactor.members" -}}
{{- $members := list }}
{{- range $i := until (int .Values.compactor.replicas) }}
{{- $members = append $members (printf "%s-%d" (include "loghost.compactor.name" $) $i) }}
{{- end }}
{{- join "," $members }}
{{- end }}

{{/*
The store URL. Required, with no default: a default bucket would be one the operator does
not own. Every template reads it through here, so whichever renders first fails with this
message (also when the schema is skipped with --skip-schema-validation).
*/}}
{{- define "loghost.storeUrl" -}}
{{- required "store.url is required: the s3://bucket/prefix of a bucket you own (or file:///data/... for a dev install); see docs/OPERATIONS.md, Install" .Values.store.url }}
{{- end }}

{{/* Store kind: "s3" or "local". */}}
{{- define "loghost.store.kind" -}}
{{- if hasPrefix "s3://" (include "loghost.storeUrl" .) }}s3{{ else }}local{{ end }}
{{- end }}

{{/*
An env var value from a YAML number or string, as the server parses it: YAML numbers reach
the templates as float64, and a whole one must print as an integer ("268435456", never
"2.68435456e+08"), a fractional one as itself ("0.9").
*/}}
{{- define "loghost.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}{{ printf "%d" (int64 .) }}{{ else }}{{ toString . }}{{ end }}
{{- end }}

{{/* LOGHOST_* env for every non-null host.config entry: maxOpenLogs -> LOGHOST_MAX_OPEN_LOGS. */}}
{{- define "loghost.host.configEnv" -}}
{{- range $key, $value := .Values.host.config }}
{{- if not (kindIs "invalid" $value) }}
{{- if not (and (kindIs "string" $value) (eq $value "")) }}
- name: {{ printf "LOGHOST_%s" ($key | snakecase | upper) }}
  value: {{ include "loghost.envValue" $value | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Pod anti-affinity across nodes for a component: (list $root "host"|"compactor" $settings),
$settings having antiAffinity (soft|hard|none) and affinity (wins when set).
*/}}
{{- define "loghost.affinity" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $c := index . 2 }}
{{- $selector := include (printf "loghost.%s.selectorLabels" $component) $root }}
{{- if $c.affinity }}
affinity:
  {{- toYaml $c.affinity | nindent 2 }}
{{- else if eq $c.antiAffinity "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- $selector | nindent 14 }}
{{- else if eq $c.antiAffinity "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- $selector | nindent 12 }}
{{- end }}
{{- end }}

{{/*
The data of an existing Secret, as JSON ("{}" when it cannot be read: offline rendering,
helm template, --dry-run=client, or no permission). The one place the chart looks Secrets up.
*/}}
{{- define "loghost.secretData" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $found := lookup "v1" "Secret" $root.Release.Namespace $name }}
{{- toJson (default (dict) (get (default (dict) $found) "data")) }}
{{- end }}

{{/*
checksum/secrets of a pod template: sha256 over the entries (list of [secret, key]) the pod
reads only at start, so `helm upgrade` after a Secret changed rolls exactly the pods that
use the changed entry. Empty when rollOnSecretChange is off.
*/}}
{{- define "loghost.secretChecksum" -}}
{{- $root := index . 0 }}
{{- $entries := index . 1 }}
{{- if $root.Values.rollOnSecretChange }}
{{- $parts := list }}
{{- range $entries }}
{{- $data := include "loghost.secretData" (list $root (index . 0)) | fromJson }}
{{- $parts = append $parts (printf "%s/%s=%s" (index . 0) (index . 1) (get $data (index . 1) | toString)) }}
{{- end }}
{{- join "\n" $parts | sha256sum }}
{{- end }}
{{- end }}

{{/* [secret, key] entries of the S3 credentials (both workloads read them at start). */}}
{{- define "loghost.s3SecretEntries" -}}
{{- $entries := list }}
{{- if and (eq (include "loghost.store.kind" .) "s3") .Values.store.s3.existingSecret }}
{{- with .Values.store.s3 }}
{{- if .credentialsFile.enabled }}
{{- $entries = append $entries (list .existingSecret .credentialsFile.key) }}
{{- else }}
{{- $entries = append $entries (list .existingSecret .accessKeyIdKey) }}
{{- $entries = append $entries (list .existingSecret .secretAccessKeyKey) }}
{{- if .sessionTokenKey }}
{{- $entries = append $entries (list .existingSecret .sessionTokenKey) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $entries }}
{{- end }}

{{/* Whether the S3 credentials are mounted as a shared-credentials file. */}}
{{- define "loghost.s3CredentialsFile" -}}
{{- if and (eq (include "loghost.store.kind" .) "s3") .Values.store.s3.existingSecret .Values.store.s3.credentialsFile.enabled }}true{{ end }}
{{- end }}

{{/*
Kubernetes memory quantity -> MiB (integer, rounded down). Accepts plain bytes,
Ki/Mi/Gi/Ti and k/K/M/G/T suffixes.
*/}}
{{- define "loghost.quantityToMiB" -}}
{{- $q := toString . }}
{{- $num := regexFind "^[0-9]+" $q | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+" $q "" }}
{{- if eq $unit "Ki" }}{{ div $num 1024 }}
{{- else if eq $unit "Mi" }}{{ $num }}
{{- else if eq $unit "Gi" }}{{ mul $num 1024 }}
{{- else if eq $unit "Ti" }}{{ mul $num 1048576 }}
{{- else if or (eq $unit "k") (eq $unit "K") }}{{ div (mul $num 1000) 1048576 }}
{{- else if eq $unit "M" }}{{ div (mul $num 1000000) 1048576 }}
{{- else if eq $unit "G" }}{{ div (mul $num 1000000000) 1048576 }}
{{- else if eq $unit "T" }}{{ div (mul $num 1000000000000) 1048576 }}
{{- else if eq $unit "" }}{{ div $num 1048576 }}
{{- else }}{{ fail (printf "cannot interpret memory quantity %q (use Mi or Gi)" $q) }}
{{- end }}
{{- end }}

{{/* Spark memory string ("2g", "1536m") -> MiB. */}}
{{- define "loghost.sparkMemToMiB" -}}
{{- $s := toString . }}
{{- $num := regexFind "^[0-9]+" $s | int64 }}
{{- if hasSuffix "g" $s }}{{ mul $num 1024 }}{{ else }}{{ $num }}{{ end }}
{{- end }}

{{/* S3 / AWS environment shared by hosts and compactors. Credentials only ever come from a Secret. */}}
{{- define "loghost.s3Env" -}}
{{- if eq (include "loghost.store.kind" .) "s3" }}
{{- with .Values.store.s3 }}
{{- if .region }}
- name: AWS_REGION
  value: {{ .region | quote }}
{{- end }}
{{- if .endpointUrl }}
- name: AWS_ENDPOINT_URL
  value: {{ .endpointUrl | quote }}
{{- end }}
{{- if and .existingSecret .credentialsFile.enabled }}
# A file, not env vars: Spark's child processes inherit only its path.
- name: AWS_SHARED_CREDENTIALS_FILE
  value: /etc/loghost/aws/credentials
{{- else if .existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .secretAccessKeyKey }}
{{- if .sessionTokenKey }}
- name: AWS_SESSION_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .sessionTokenKey }}
      optional: true
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Volumes for a local (file) store, shared by hosts and compactors when an existing claim is given. */}}
{{- define "loghost.localStoreVolume" -}}
{{- if .Values.store.local.existingClaim }}
- name: data
  persistentVolumeClaim:
    claimName: {{ .Values.store.local.existingClaim }}
{{- else if not .Values.host.persistence.enabled }}
- name: data
  emptyDir: {}
{{- end }}
{{- end }}

{{/* Hard checks that the JSON schema cannot express (cross-field arithmetic). */}}
{{- define "loghost.validate" -}}
{{- $_ := include "loghost.storeUrl" . }}
{{- $h := .Values.host }}
{{- /* null: the server's default shutdown grace, 30 s (host/config.py; a test keeps them equal) */}}
{{- $grace := $h.config.shutdownGraceS }}
{{- if kindIs "invalid" $grace }}{{- $grace = 30 }}{{- end }}
{{- $needed := add (int $h.preStopDelaySeconds) (int $grace) }}
{{- if le (int $h.terminationGracePeriodSeconds) (int $needed) }}
{{- fail (printf "host.terminationGracePeriodSeconds (%d) must exceed host.preStopDelaySeconds + host.config.shutdownGraceS (%d), or open logs are killed before they are flushed" (int $h.terminationGracePeriodSeconds) (int $needed)) }}
{{- end }}
{{- if eq (include "loghost.store.kind" .) "local" }}
{{- $url := include "loghost.storeUrl" . }}
{{- if and (not .Values.store.local.existingClaim) (or (gt (int $h.replicas) 1) .Values.compactor.enabled) }}
{{- fail "a local (file) store is dev-only: every host and compactor must see the same directory, so either set store.local.existingClaim (a ReadWriteMany PVC) or run host.replicas=1 with compactor.enabled=false" }}
{{- end }}
{{- if and .Values.store.local.existingClaim $h.persistence.enabled }}
{{- fail "set either store.local.existingClaim or host.persistence.enabled, not both" }}
{{- end }}
{{- if not (or (hasPrefix (printf "file://%s" .Values.store.local.mountPath) $url) (hasPrefix .Values.store.local.mountPath $url)) }}
{{- fail (printf "store.url %q must point inside store.local.mountPath %q (the only writable volume)" $url .Values.store.local.mountPath) }}
{{- end }}
{{- else if $h.persistence.enabled }}
{{- fail "host.persistence.enabled only makes sense with a local (file) store; an S3 store needs no volume" }}
{{- end }}
{{- if .Values.compactor.enabled }}
{{- with .Values.compactor }}
{{- if and (eq .workload "Deployment") (eq .membership.mode "static") (gt (int .replicas) 1) }}
{{- fail (printf "compactor.replicas=%d with compactor.workload=Deployment needs compactor.membership.mode=kubernetes: a Deployment's pod names are random, so a static member list cannot name them. Set compactor.membership.mode=kubernetes (the supervisor lists the live pods; RBAC: list pods in the namespace), or compactor.workload=StatefulSet (stable pod names), or compactor.replicas=1" (int .replicas)) }}
{{- end }}
{{- end }}
{{- if and .Values.compactor.autoscaling.enabled (ne .Values.compactor.membership.mode "kubernetes") }}
{{- fail "compactor.autoscaling.enabled requires compactor.membership.mode=kubernetes: with static membership the member list is fixed at render time and would go stale when the HPA changes the replica count" }}
{{- end }}
{{- with .Values.compactor.autoscaling }}
{{- if and .enabled (gt (int .minReplicas) (int .maxReplicas)) }}
{{- fail (printf "compactor.autoscaling.minReplicas (%d) exceeds maxReplicas (%d)" (int .minReplicas) (int .maxReplicas)) }}
{{- end }}
{{- end }}
{{- with .Values.compactor.resources.limits }}
{{- if .memory }}
{{- $limit := include "loghost.quantityToMiB" .memory | int64 }}
{{- $driver := include "loghost.sparkMemToMiB" $.Values.compactor.spark.driverMemory | int64 }}
{{- $want := add $driver (int64 $.Values.compactor.spark.memoryOverheadMiB) }}
{{- if lt $limit $want }}
{{- fail (printf "compactor.resources.limits.memory (%s = %dMi) is below compactor.spark.driverMemory (%s) + compactor.spark.memoryOverheadMiB (%d): the Spark JVM would be OOM-killed" .memory $limit $.Values.compactor.spark.driverMemory (int64 $.Values.compactor.spark.memoryOverheadMiB)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The S3 shared-credentials file: one entry of the S3 Secret, as a directory mount (kubelet
updates it; the pods still read it only at start, hence checksum/secrets). */}}
{{- define "loghost.awsCredentialsVolume" -}}
- name: aws-credentials
  secret:
    secretName: {{ .Values.store.s3.existingSecret }}
    items:
      - key: {{ .Values.store.s3.credentialsFile.key }}
        path: credentials
    defaultMode: 0440
{{- end }}

{{/* The compactor probes' check (python -c SCRIPT FILE MAX_AGE): exit 0 while the heartbeat
file is younger than MAX_AGE seconds; a missing or stale one fails with a line saying why. */}}
{{- define "loghost.compactor.heartbeatScript" -}}
import os, sys, time
path, limit = sys.argv[1], float(sys.argv[2])
try:
    age = time.time() - os.stat(path).st_mtime
except OSError:
    sys.exit(f"no heartbeat at {path}: the round loop has not started")
if age > limit:
    sys.exit(f"the round loop has not finished a round for {age:.0f}s (limit {limit:.0f}s)")
{{- end }}

{{/* spec.replicas of the live host StatefulSet, or "" when it cannot be read (offline
rendering, helm template, --dry-run=client, a first install). Used by NOTES.txt only. */}}
{{- define "loghost.host.liveReplicas" -}}
{{- $found := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "loghost.host.name" .) }}
{{- with $found }}{{ with .spec }}{{ with .replicas }}{{ . }}{{ end }}{{ end }}{{ end }}
{{- end }}

{{/* Egress rules of both NetworkPolicies, when networkPolicy.egress lists any. */}}
{{- define "loghost.networkPolicy.egress" -}}
{{- with .Values.networkPolicy.egress }}
egress:
  # DNS, wherever the cluster runs it.
  - ports:
      - port: 53
        protocol: UDP
      - port: 53
        protocol: TCP
  # The release's own pods (compactors pull dirty sets from every host).
  - to:
      - podSelector:
          matchLabels:
            {{- include "loghost.selectorLabels" $ | nindent 12 }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
