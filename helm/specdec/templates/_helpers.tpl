{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "specdec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name prefix of every resource. Kept to 40 characters: KubeRay derives names such as
<rayservice>-<5 random>-head-svc / -serve-svc and pod names from it.
*/}}
{{- define "specdec.fullname" -}}
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

{{- define "specdec.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "specdec.labels" -}}
helm.sh/chart: {{ include "specdec.chart" . }}
{{ include "specdec.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that identify this release's pods. */}}
{{- define "specdec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdec.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Label every Ray pod (head and workers) of this release carries, and nothing else does. */}}
{{- define "specdec.rayPodLabels" -}}
{{ include "specdec.selectorLabels" . }}
specdec-ray-node: "true"
{{- end }}

{{/* Labels of the Redis pod. */}}
{{- define "specdec.redisSelectorLabels" -}}
{{ include "specdec.selectorLabels" . }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "specdec.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* ---------------- Redis wiring ---------------- */}}

{{/* Secret holding the Redis password (chart-made or existing). */}}
{{- define "specdec.redisSecretName" -}}
{{- if .Values.redis.enabled }}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis" (include "specdec.fullname" .)) }}
{{- else }}
{{- .Values.externalRedis.existingSecret | default (printf "%s-redis" (include "specdec.fullname" .)) }}
{{- end }}
{{- end }}

{{- define "specdec.redisSecretKey" -}}
{{- if .Values.redis.enabled }}
{{- .Values.redis.auth.existingSecretPasswordKey | default "redis-password" }}
{{- else }}
{{- .Values.externalRedis.existingSecretPasswordKey | default "redis-password" }}
{{- end }}
{{- end }}

{{/* "true" when this chart must create the password Secret. */}}
{{- define "specdec.createRedisSecret" -}}
{{- if .Values.redis.enabled }}
{{- not .Values.redis.auth.existingSecret }}
{{- else }}
{{- and (not .Values.externalRedis.existingSecret) (ne (toString .Values.externalRedis.password) "") }}
{{- end }}
{{- end }}

{{/* "true" when the Ray pods get SPECDEC_REDIS_PASSWORD. */}}
{{- define "specdec.redisHasPassword" -}}
{{- or .Values.redis.enabled (ne .Values.externalRedis.existingSecret "") (ne (toString .Values.externalRedis.password) "") }}
{{- end }}

{{/* URL of the Redis (no password inside). */}}
{{- define "specdec.redisUrl" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s-redis.%s.svc:%d/0" (include "specdec.fullname" .) .Release.Namespace (int .Values.redis.port) }}
{{- else }}
{{- required "specdec needs a Redis: set redis.enabled=true or externalRedis.url" .Values.externalRedis.url }}
{{- end }}
{{- end }}

{{/* ---------------- Ray pods ---------------- */}}

{{/* `ray start` parameters: every value a string, as the CRD requires. */}}
{{- define "specdec.rayStartParams" -}}
{{- $params := dict }}
{{- range $key, $value := . }}
{{- $_ := set $params $key (toString $value) }}
{{- end }}
{{- toYaml $params }}
{{- end }}

{{/* Environment of every Ray container. Argument: the root context. */}}
{{- define "specdec.rayEnv" -}}
- name: SPECDEC_REDIS_URL
  value: {{ include "specdec.redisUrl" . | quote }}
{{- if eq (include "specdec.redisHasPassword" .) "true" }}
- name: SPECDEC_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "specdec.redisSecretName" . }}
      key: {{ include "specdec.redisSecretKey" . }}
{{- end }}
- name: HF_HOME
  value: /home/specdec/.cache/huggingface
{{- if .Values.huggingface.tokenSecretName }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.huggingface.tokenSecretName }}
      key: {{ .Values.huggingface.tokenSecretKey }}
{{- end }}
{{- end }}

{{/*
Resources of a worker container: the group's CPU/memory plus its GPUs in requests and limits.
Argument: dict "root" $ "group" <workerGroups entry>.
*/}}
{{- define "specdec.workerResources" -}}
{{- $res := deepCopy (.group.resources | default dict) }}
{{- if gt (float64 .group.gpus) 0.0 }}
{{- $gpu := dict .root.Values.gpuResourceName (int .group.gpus) }}
{{- $_ := set $res "limits" (merge $gpu (get $res "limits" | default dict)) }}
{{- $_ := set $res "requests" (merge (deepCopy $gpu) (get $res "requests" | default dict)) }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{/* Refuse values that cannot schedule: the target group needs tp x target_num_gpus GPUs. */}}
{{- define "specdec.validateValues" -}}
{{- $serving := .Values.specdec.config.serving | default dict }}
{{- $tp := float64 ($serving.tensor_parallel_size | default 1) }}
{{- $targetGpus := float64 ($serving.target_num_gpus | default 0) }}
{{- $draftGpus := float64 ($serving.draft_num_gpus | default 0) }}
{{- $target := .Values.workerGroups.target }}
{{- $draft := .Values.workerGroups.draft }}
{{- if and $target.enabled (gt (mulf $tp $targetGpus) (float64 $target.gpus)) }}
{{- fail (printf "workerGroups.target.gpus (%v) < serving.tensor_parallel_size (%v) x serving.target_num_gpus (%v): the target ranks are packed onto one pod" $target.gpus $tp $targetGpus) }}
{{- end }}
{{- if and $draft.enabled (gt $draftGpus (float64 $draft.gpus)) }}
{{- fail (printf "workerGroups.draft.gpus (%v) < serving.draft_num_gpus (%v)" $draft.gpus $draftGpus) }}
{{- end }}
{{- if and (not $target.enabled) (gt $targetGpus 0.0) }}
{{- fail "serving.target_num_gpus > 0 needs workerGroups.target.enabled (the head has num-gpus 0)" }}
{{- end }}
{{- end }}

{{/* The Serve config (ServeDeploySchema) embedded as the RayService's serveConfigV2. */}}
{{- define "specdec.serveConfig" -}}
{{- $args := deepCopy (.Values.specdec.config | default dict) }}
{{- $serving := deepCopy (get $args "serving" | default dict) }}
{{- $_ := set $serving "port" (int .Values.grpc.port) }}
{{- $_ := set $args "serving" $serving }}
{{- $app := dict "name" .Values.serve.appName "import_path" .Values.serve.importPath "route_prefix" (printf "/%s" .Values.serve.appName) "args" $args }}
{{- with .Values.serve.runtimeEnv }}
{{- $_ := set $app "runtime_env" . }}
{{- end }}
{{- $config := dict "proxy_location" .Values.serve.proxyLocation }}
{{- $_ := set $config "http_options" (dict "host" "0.0.0.0" "port" (int .Values.serve.httpPort)) }}
{{- $_ := set $config "grpc_options" (dict "port" (int .Values.grpc.port) "grpc_servicer_functions" .Values.serve.grpcServicerFunctions) }}
{{- $_ := set $config "applications" (list $app) }}
{{- toYaml $config }}
{{- end }}
