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

{{/* "true" when this chart must create the password Secret (its own Redis, no existing Secret). */}}
{{- define "specdec.createRedisSecret" -}}
{{- and .Values.redis.enabled (not .Values.redis.auth.existingSecret) }}
{{- end }}

{{/* "true" when the Ray pods get SPECDEC_REDIS_PASSWORD. */}}
{{- define "specdec.redisHasPassword" -}}
{{- or .Values.redis.enabled (ne .Values.externalRedis.existingSecret "") }}
{{- end }}

{{/* Where an external Redis's CA certificate is mounted on the Ray pods. */}}
{{- define "specdec.redisCaDir" -}}
/etc/specdec/redis-ca
{{- end }}

{{/* URL of the Redis (no password inside; an external one's CA file added as ssl_ca_certs). */}}
{{- define "specdec.redisUrl" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s-redis.%s.svc:%d/0" (include "specdec.fullname" .) .Release.Namespace (int .Values.redis.port) }}
{{- else }}
{{- $url := required "specdec needs a Redis: set redis.enabled=true or externalRedis.url" .Values.externalRedis.url }}
{{- if .Values.externalRedis.caSecret }}
{{- printf "%s%sssl_ca_certs=%s/%s" $url (ternary "&" "?" (contains "?" $url)) (include "specdec.redisCaDir" .) .Values.externalRedis.caSecretKey }}
{{- else }}
{{- $url }}
{{- end }}
{{- end }}
{{- end }}

{{/* Redis address of the GCS fault tolerance: host:port (rediss:// kept for TLS). */}}
{{- define "specdec.gcsRedisAddress" -}}
{{- $ft := .Values.ray.gcsFaultTolerance }}
{{- if $ft.redisAddress }}
{{- $ft.redisAddress }}
{{- else if .Values.redis.enabled }}
{{- printf "%s-redis.%s.svc:%d" (include "specdec.fullname" .) .Release.Namespace (int .Values.redis.port) }}
{{- else }}
{{- $url := urlParse (required "specdec needs a Redis: set redis.enabled=true or externalRedis.url" .Values.externalRedis.url) }}
{{- if eq $url.scheme "rediss" }}
{{- printf "rediss://%s" $url.host }}
{{- else }}
{{- $url.host }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A generated secret value, stable across renders that can see the cluster: the value already in
the Secret (lookup) when there is one, else a new random one. Argument: dict "root" $ "name"
<Secret name> "key" <data key> "length" <characters>. Plain `helm template` cannot look the
Secret up (a new value each time): such renders should use the existingSecret values instead.
*/}}
{{- define "specdec.lookupOrRandom" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name }}
{{- if and $existing $existing.data (hasKey $existing.data .key) }}
{{- index $existing.data .key | b64dec }}
{{- else }}
{{- randAlphaNum (int .length) }}
{{- end }}
{{- end }}

{{/* ---------------- Security of the public API and of internal traffic ---------------- */}}

{{/* The servicer function of specdec_rpc/public/public_tls.py that adds the TLS port inside Serve's gRPC proxy. */}}
{{- define "specdec.tlsServicerFunction" -}}
specdec_rpc.public.public_tls.add_tls_port_to_server
{{- end }}

{{- define "specdec.apiTokensSecretName" -}}
{{- .Values.security.auth.existingSecret | default (printf "%s-api-tokens" (include "specdec.fullname" .)) }}
{{- end }}

{{- define "specdec.internalSecretName" -}}
{{- .Values.security.internal.existingSecret | default (printf "%s-internal" (include "specdec.fullname" .)) }}
{{- end }}

{{/* The `security` section of the specdec config: files mounted by specdec.securityVolumes. */}}
{{- define "specdec.securityArgs" -}}
{{- $sec := dict "open_health" .Values.security.auth.openHealth }}
{{- $_ := set $sec "internal_secret_file" (printf "/etc/specdec/internal/%s" .Values.security.internal.secretKey) }}
{{- if .Values.security.auth.enabled }}
{{- $_ := set $sec "api_tokens_file" (printf "/etc/specdec/api-tokens/%s" .Values.security.auth.secretKey) }}
{{- end }}
{{- if .Values.security.tls.existingSecret }}
{{- $_ := set $sec "tls_cert_file" (printf "/etc/specdec/tls/%s" .Values.security.tls.certKey) }}
{{- $_ := set $sec "tls_key_file" (printf "/etc/specdec/tls/%s" .Values.security.tls.keyKey) }}
{{- end }}
{{- toYaml $sec }}
{{- end }}

{{/* Secret volumes of every Ray pod (read-only files, group-readable by the pod's fsGroup). */}}
{{- define "specdec.securityVolumes" -}}
- name: internal-secret
  secret:
    secretName: {{ include "specdec.internalSecretName" . }}
    defaultMode: 0440
{{- if .Values.security.auth.enabled }}
- name: api-tokens
  secret:
    secretName: {{ include "specdec.apiTokensSecretName" . }}
    defaultMode: 0440
{{- end }}
{{- if .Values.security.tls.existingSecret }}
- name: api-tls
  secret:
    secretName: {{ .Values.security.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.caSecret }}
- name: redis-ca
  secret:
    secretName: {{ .Values.externalRedis.caSecret }}
    defaultMode: 0444
{{- end }}
{{- end }}

{{- define "specdec.securityMounts" -}}
- name: internal-secret
  mountPath: /etc/specdec/internal
  readOnly: true
{{- if .Values.security.auth.enabled }}
- name: api-tokens
  mountPath: /etc/specdec/api-tokens
  readOnly: true
{{- end }}
{{- if .Values.security.tls.existingSecret }}
- name: api-tls
  mountPath: /etc/specdec/tls
  readOnly: true
{{- end }}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.caSecret }}
- name: redis-ca
  mountPath: {{ include "specdec.redisCaDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Writable emptyDirs of every Ray pod (the root filesystem is read-only). Argument: dict "root" $ "shm" <size>. */}}
{{- define "specdec.writableVolumes" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .shm }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .root.Values.rayPods.tmpSizeLimit }}
- name: home-cache
  emptyDir:
    sizeLimit: {{ .root.Values.rayPods.cacheSizeLimit }}
{{- end }}

{{- define "specdec.writableMounts" -}}
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
- name: home-cache
  mountPath: /home/specdec/.cache
{{- end }}

{{/* Container security context of the Ray containers. */}}
{{- define "specdec.raySecurityContext" -}}
{{- $ctx := deepCopy .Values.rayPods.securityContext }}
{{- $_ := set $ctx "readOnlyRootFilesystem" .Values.rayPods.readOnlyRootFilesystem }}
{{- toYaml $ctx }}
{{- end }}

{{/*
Ray's own health (raylet through the dashboard agent, GCS through the dashboard), as KubeRay checks
it. Argument: the probe's values; each of the two requests gets half of its timeoutSeconds.
*/}}
{{- define "specdec.rayHealthCommand" -}}
{{- $t := max 1 (div (int .timeoutSeconds) 2) }}
exec:
  command:
    - bash
    - -c
    - wget -T {{ $t }} -q -O- http://localhost:52365/api/local_raylet_healthz | grep success && wget -T {{ $t }} -q -O- http://localhost:8265/api/gcs_healthz | grep success
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
- name: XDG_CACHE_HOME
  value: /home/specdec/.cache
- name: TRITON_CACHE_DIR
  value: /home/specdec/.cache/triton
# Serve's proxy start-up hook (actors/serve_proxy.py): Serve's gRPC port binds SPECDEC_BIND_HOST
# (loopback beside the TLS port), a dead router replica's HTTP requests end as 503 / an SSE error event
- name: RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH
  value: actors.serve_proxy.setup_proxy
- name: SPECDEC_BIND_HOST
  value: "0.0.0.0"
# Serve's quieter background, as `specdec serve` starts Ray (actors/stack_environment.py says why):
# the controller reconciles twice a second, Serve's metrics go to Ray's once a second, the router
# runs on the replica's own event loop
- name: RAY_SERVE_CONTROL_LOOP_INTERVAL_S
  value: "0.5"
- name: RAY_SERVE_METRICS_EXPORT_INTERVAL_MS
  value: "1000"
- name: RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD
  value: "0"
{{- with .Values.security.tls }}
{{- if .existingSecret }}
# read by specdec_rpc.public.public_tls inside Serve's gRPC proxy (Ray's processes inherit the container's env)
- name: SPECDEC_TLS_PORT
  value: {{ $.Values.grpc.port | quote }}
- name: SPECDEC_TLS_CERT_FILE
  value: {{ printf "/etc/specdec/tls/%s" .certKey | quote }}
- name: SPECDEC_TLS_KEY_FILE
  value: {{ printf "/etc/specdec/tls/%s" .keyKey | quote }}
{{- end }}
{{- end }}
{{- if eq (include "specdec.ingress" .) "direct" }}
{{- $ports := include "specdec.directPorts" . | fromYaml }}
# serving.ingress direct: Serve's direct ingress, each router replica serving gRPC and HTTP on ports
# of its own (Ray's processes read these at start; actors/serve_endpoints.py: direct_environment)
- name: RAY_SERVE_ENABLE_DIRECT_INGRESS
  value: "1"
- name: RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT
  value: {{ index $ports.grpc 0 | int | quote }}
- name: RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT
  value: {{ index $ports.grpc 1 | int | quote }}
- name: RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT
  value: {{ index $ports.http 0 | int | quote }}
- name: RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT
  value: {{ index $ports.http 1 | int | quote }}
- name: RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S
  value: "0"
- name: RAY_SERVE_PORT_QUARANTINE_S
  value: "0"
{{- end }}
{{- if and .Values.ray.gcsFaultTolerance.enabled (not .Values.redis.enabled) .Values.externalRedis.caSecret }}
- name: RAY_REDIS_CA_CERT
  value: {{ printf "%s/%s" (include "specdec.redisCaDir" .) .Values.externalRedis.caSecretKey | quote }}
{{- end }}
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
{{- if and .Values.security.tls.existingSecret (eq (int .Values.grpc.port) (int .Values.grpc.tlsInternalPort)) }}
{{- fail "grpc.tlsInternalPort must differ from grpc.port (the TLS port) when security.tls.existingSecret is set" }}
{{- end }}
{{- if and (not $target.enabled) (gt $targetGpus 0.0) }}
{{- fail "serving.target_num_gpus > 0 needs workerGroups.target.enabled (the head has num-gpus 0)" }}
{{- end }}
{{- end }}

{{/* specdec.config.serving.ingress: "proxy" (the schema's default) or "direct". */}}
{{- define "specdec.ingress" -}}
{{- dig "serving" "ingress" "proxy" (.Values.specdec.config | default dict) -}}
{{- end }}

{{/*
With serving.ingress direct: the router replicas' gRPC and HTTP port ranges, [first, end) each,
four ports per replica from serving.direct_port / direct_http_port (the defaults are the config
schema's; specdec/config/config_rules.py: direct_ports; tests/deploy check they agree).
*/}}
{{- define "specdec.directPorts" -}}
{{- $serving := dig "serving" dict (.Values.specdec.config | default dict) }}
{{- $count := mul 4 (dig "router_replicas" 1 $serving | int) }}
{{- $grpc := dig "direct_port" 40000 $serving | int }}
{{- $http := dig "direct_http_port" 30000 $serving | int }}
grpc: [{{ $grpc }}, {{ add $grpc $count }}]
http: [{{ $http }}, {{ add $http $count }}]
{{- end }}

{{/* The Serve config (ServeDeploySchema) embedded as the RayService's serveConfigV2. */}}
{{- define "specdec.serveConfig" -}}
{{- $args := deepCopy (.Values.specdec.config | default dict) }}
{{- $serving := deepCopy (get $args "serving" | default dict) }}
{{- $_ := set $serving "port" (int .Values.grpc.port) }}
{{- $_ := set $serving "http_port" (int .Values.serve.httpPort) }}
{{- $_ := set $args "serving" $serving }}
{{- $_ := set $args "security" (include "specdec.securityArgs" . | fromYaml) }}
{{- $app := dict "name" .Values.serve.appName "import_path" .Values.serve.importPath "route_prefix" "/" "args" $args }}
{{- /* The router's replicas run on the head, whose preStop hook drains them (nothing drains a
worker pod's): Ray's own head-node resource, a sliver per replica; the rest of the options the
code gives (actors/router.py), which these replace. */}}
{{- $pin := dict "node:__internal_head__" 0.001 }}
{{- $router := dict "name" "SpecdecRouter" "ray_actor_options" (dict "num_cpus" 0 "resources" $pin) }}
{{- $_ := set $app "deployments" (list $router) }}
{{- with .Values.serve.runtimeEnv }}
{{- $_ := set $app "runtime_env" . }}
{{- end }}
{{- $config := dict "proxy_location" .Values.serve.proxyLocation }}
{{- $_ := set $config "http_options" (dict "host" "0.0.0.0" "port" (int .Values.serve.httpPort)) }}
{{- if .Values.security.tls.existingSecret }}
{{- /* TLS: specdec's servicer function adds the TLS port grpc.port; Serve's plaintext port moves inside */}}
{{- $functions := concat .Values.serve.grpcServicerFunctions (list (include "specdec.tlsServicerFunction" .)) }}
{{- $_ := set $config "grpc_options" (dict "port" (int .Values.grpc.tlsInternalPort) "grpc_servicer_functions" $functions) }}
{{- else }}
{{- $_ := set $config "grpc_options" (dict "port" (int .Values.grpc.port) "grpc_servicer_functions" .Values.serve.grpcServicerFunctions) }}
{{- end }}
{{- $_ := set $config "applications" (list $app) }}
{{- toYaml $config }}
{{- end }}

{{/* Port of the external Redis, from its URL (6379 when the URL names none). */}}
{{- define "specdec.externalRedisPort" -}}
{{- $host := (urlParse .Values.externalRedis.url).host }}
{{- if contains ":" $host }}
{{- last (splitList ":" $host) }}
{{- else }}
{{- 6379 }}
{{- end }}
{{- end }}

{{/*
The drain's grace period in whole seconds: specdec.config.serving.shutdown_grace_s, else the
config schema's default (20; tests/deploy check they agree).
*/}}
{{- define "specdec.shutdownGraceSeconds" -}}
{{- dig "serving" "shutdown_grace_s" 20 (.Values.specdec.config | default dict) | float64 | ceil | int -}}
{{- end }}

{{/*
The head's preStop hook: drain the routers before Kubernetes sends SIGTERM (`specdec drain`).
*/}}
{{- define "specdec.drainCommand" -}}
{{- $replicas := dig "serving" "router_replicas" 1 (.Values.specdec.config | default dict) | int -}}
- specdec
- drain
- --app
- {{ .Values.serve.appName | quote }}
- --replicas
- {{ $replicas | quote }}
- --grace
- {{ include "specdec.shutdownGraceSeconds" . | quote }}
{{- end }}
