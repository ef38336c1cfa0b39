{{/* Names, labels, image and shared pod settings. */}}

{{- define "trainsentry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<chart>, or the release name alone when it already contains the chart name. */}}
{{- define "trainsentry.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "trainsentry.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Resource name of a component: (dict "ctx" $ "component" "gateway") */}}
{{- define "trainsentry.componentName" -}}
{{- printf "%s-%s" (include "trainsentry.fullname" .ctx) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "trainsentry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainsentry.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels of every object: (dict "ctx" $ "component" "gateway") */}}
{{- define "trainsentry.labels" -}}
{{ include "trainsentry.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: trainsentry
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "trainsentry.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "trainsentry.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod security context of our own (non-exporter) pods. */}}
{{- define "trainsentry.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  fsGroupChangePolicy: OnRootMismatch
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* Container security context: nothing to escalate, nothing to write, no capabilities. */}}
{{- define "trainsentry.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  privileged: false
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* Scheduling settings shared by the component pods: pass the component's values. */}}
{{- define "trainsentry.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Node placement of an exporter DaemonSet: (dict "ctx" $ "serves" (list "dcgm")).
     exporters.nodeSelector, when set, places every exporter. Otherwise the pod runs on the
     nodes the operator labels `trainsentry.io/exporter-<name>: "true"` for any TrainingJob
     exporter flag it serves (trainsentry/operator/nodes.py), so a job with
     spec.exporters.<name>: false does not get it; several flags are ORed (node affinity). */}}
{{- define "trainsentry.exporterPlacement" -}}
{{- $e := .ctx.Values.exporters -}}
{{- if $e.nodeSelector -}}
nodeSelector:
  {{- toYaml $e.nodeSelector | nindent 2 }}
{{- else if eq (len .serves) 1 -}}
nodeSelector:
  trainsentry.io/exporter-{{ first .serves }}: "true"
{{- else -}}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        {{- range .serves }}
        - matchExpressions:
            - {key: trainsentry.io/exporter-{{ . }}, operator: In, values: ["true"]}
        {{- end }}
{{- end -}}
{{- end -}}

{{/* Environment every trainsentry container gets (python on a read-only root). */}}
{{- define "trainsentry.baseEnv" -}}
- name: HOME
  value: /tmp
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
{{- end -}}

{{/* Secret names. */}}
{{- define "trainsentry.authSecretName" -}}
{{- default (include "trainsentry.componentName" (dict "ctx" . "component" "gateway-auth")) .Values.gateway.auth.existingSecret -}}
{{- end -}}

{{- define "trainsentry.databaseSecretName" -}}
{{- default (include "trainsentry.componentName" (dict "ctx" . "component" "database")) .Values.gateway.database.postgresql.existingSecret -}}
{{- end -}}

{{- define "trainsentry.channelsSecretName" -}}
{{- default (include "trainsentry.componentName" (dict "ctx" . "component" "channels")) .Values.channels.existingSecret -}}
{{- end -}}

{{- define "trainsentry.sqliteClaimName" -}}
{{- default (include "trainsentry.componentName" (dict "ctx" . "component" "gateway-data")) .Values.gateway.database.sqlite.existingClaim -}}
{{- end -}}

{{/* The store: env TRAINSENTRY_DB (a value for SQLite, a Secret reference for PostgreSQL). */}}
{{- define "trainsentry.databaseEnv" -}}
- name: TRAINSENTRY_DB
{{- if eq .Values.gateway.database.type "postgresql" }}
  valueFrom:
    secretKeyRef:
      name: {{ include "trainsentry.databaseSecretName" . }}
      key: {{ if .Values.gateway.database.postgresql.existingSecret }}{{ .Values.gateway.database.postgresql.existingSecretKey }}{{ else }}url{{ end }}
{{- else }}
  value: sqlite:////var/lib/trainsentry/trainsentry.db
{{- end }}
{{- end -}}

{{/* Secrets and the config file of the gateway and report pods:
     (dict "ctx" $ "configFile" "config.yaml") */}}
{{- define "trainsentry.appEnv" -}}
{{ include "trainsentry.baseEnv" .ctx }}
- name: TRAINSENTRY_CONFIG
  value: /etc/trainsentry/{{ .configFile }}
{{ include "trainsentry.databaseEnv" .ctx }}
- name: TRAINSENTRY_WEBHOOK_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "trainsentry.authSecretName" .ctx }}
      key: {{ .ctx.Values.gateway.auth.webhookTokenKey }}
- name: TRAINSENTRY_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "trainsentry.authSecretName" .ctx }}
      key: {{ .ctx.Values.gateway.auth.apiTokenKey }}
{{- end -}}

{{/* Seconds in a Prometheus duration ("4h", "1h30m", "90s"). */}}
{{- define "trainsentry.durationSeconds" -}}
{{- $units := dict "ms" 0.001 "s" 1 "m" 60 "h" 3600 "d" 86400 "w" 604800 "y" 31536000 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" (toString .) -1 -}}
{{- $unit := regexReplaceAll "^[0-9]+" . "" -}}
{{- $total = addf $total (mulf (regexReplaceAll "[a-z]+$" . "" | float64) (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* gateway.stale_after_seconds: an alert Alertmanager has not repeated for this long is
     expired, so it must outlast the longest repeat interval of the route (the file's route,
     its child routes, the values override) by half an hour; never below the gateway's
     default of 4.5 h. gateway.staleAfterSeconds > 0 sets it outright. */}}
{{- define "trainsentry.staleAfterSeconds" -}}
{{- if gt (.Values.gateway.staleAfterSeconds | int) 0 -}}
{{- .Values.gateway.staleAfterSeconds | int -}}
{{- else -}}
{{- $route := dict -}}
{{- with .Files.Get "files/rules/alertmanager-inhibit.yaml" -}}
{{- $route = (fromYaml .).route | default dict -}}
{{- end -}}
{{- $intervals := list (.Values.alertmanager.config.route.repeatInterval | default $route.repeat_interval | default "4h") -}}
{{- if .Values.alertmanager.config.route.childRoutes -}}
{{- range ($route.routes | default list) -}}
{{- with .repeat_interval }}{{ $intervals = append $intervals . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $longest := 16200.0 -}}
{{- range $intervals -}}
{{- $seconds := addf (include "trainsentry.durationSeconds" . | float64) 1800 -}}
{{- if gt $seconds $longest }}{{ $longest = $seconds }}{{ end -}}
{{- end -}}
{{- $longest | int -}}
{{- end -}}
{{- end -}}

{{- define "trainsentry.hasChannelSecrets" -}}
{{- if or .Values.channels.existingSecret .Values.channels.secretEnv }}true{{ end -}}
{{- end -}}

{{/* Refuse combinations the schema cannot express well; message says what to change.
     (replicas > 1 with SQLite is here, not a schema if/then: helm words a failed if/then
     as `Must validate "then" as "if" was valid`, naming neither replicas nor PostgreSQL.) */}}
{{- define "trainsentry.validate" -}}
{{- $g := .Values.gateway -}}
{{- if and (gt (int $g.replicas) 1) (eq $g.database.type "sqlite") -}}
{{- fail "gateway.replicas > 1 needs gateway.database.type=postgresql: one SQLite file on a ReadWriteOnce volume cannot be shared by several gateways" -}}
{{- end -}}
{{- if and (eq $g.database.type "postgresql") (not $g.database.postgresql.existingSecret) (not $g.database.postgresql.url) -}}
{{- fail "gateway.database.type=postgresql needs gateway.database.postgresql.existingSecret (or .url)" -}}
{{- end -}}
{{- if and $g.database.postgresql.existingSecret $g.database.postgresql.url -}}
{{- fail "set gateway.database.postgresql.existingSecret or .url, not both" -}}
{{- end -}}
{{- if eq (int $g.triggerPort) (int $g.port) -}}
{{- fail "gateway.triggerPort must differ from gateway.port (0: no trigger port)" -}}
{{- end -}}
{{- if and (gt (int $g.triggerPort) 0) (eq (int $g.service.triggerPort) (int $g.service.port)) -}}
{{- fail "gateway.service.triggerPort must differ from gateway.service.port" -}}
{{- end -}}
{{- if and .Values.channels.existingSecret .Values.channels.secretEnv -}}
{{- fail "set channels.existingSecret or channels.secretEnv, not both" -}}
{{- end -}}
{{- if and $g.auth.existingSecret (or $g.auth.webhookToken $g.auth.apiToken $g.auth.probeToken) -}}
{{- fail "gateway.auth.existingSecret holds the tokens: leave gateway.auth.webhookToken/apiToken/probeToken empty" -}}
{{- end -}}
{{- $probeToken := include "trainsentry.probeTokenEnv" . -}}
{{- if hasKey (.Values.channels.secretEnv | default dict) $probeToken -}}
{{- fail (printf "the probes' token is gateway.auth's %s now (generated, or gateway.auth.probeToken, or the key %s of gateway.auth.existingSecret): remove %s from channels.secretEnv" $g.auth.probeTokenKey $g.auth.probeTokenKey $probeToken) -}}
{{- end -}}
{{- end -}}

{{/* The variable the gateway reads the probes' master token from (diagnosis.probe_token_env). */}}
{{- define "trainsentry.probeTokenEnv" -}}
{{- get (.Values.gateway.diagnosis | default dict) "probe_token_env" | default "TRAINSENTRY_PROBE_TOKEN" -}}
{{- end -}}

{{/* The probes' master token from the auth Secret: (dict "ctx" $ "name" "ENV_NAME") */}}
{{- define "trainsentry.probeTokenRef" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "trainsentry.authSecretName" .ctx }}
      key: {{ .ctx.Values.gateway.auth.probeTokenKey }}
{{- end -}}

{{/* Is the admission webhook on: "true" or "". */}}
{{- define "trainsentry.webhookOn" -}}
{{- if and .Values.operator.enabled .Values.operator.webhook.enabled }}true{{ end -}}
{{- end -}}

{{- define "trainsentry.webhookService" -}}
{{- include "trainsentry.componentName" (dict "ctx" . "component" "operator-webhook") -}}
{{- end -}}

{{- define "trainsentry.webhookCredentials" -}}
{{- printf "%s-credentials" (include "trainsentry.webhookService" .) -}}
{{- end -}}

{{- define "trainsentry.webhookConfiguration" -}}
{{- include "trainsentry.componentName" (dict "ctx" . "component" "instrument") -}}
{{- end -}}

{{/* The label the operator keeps on each namespace holding a TrainingJob
(trainsentry/operator/namespace_label.py); the webhook's and the gateway's selectors read it. */}}
{{- define "trainsentry.jobNamespaceLabel" -}}trainsentry.io/trainingjobs{{- end -}}

{{/* The namespaces whose pods may be a TrainingJob's: operator.namespaces by name, else
those the operator labels. A namespaceSelector's body. */}}
{{- define "trainsentry.jobNamespaces" -}}
{{- if .Values.operator.namespaces -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values: {{ toJson .Values.operator.namespaces }}
{{- else -}}
matchLabels:
  {{ include "trainsentry.jobNamespaceLabel" . }}: "true"
{{- end -}}
{{- end -}}

{{/* The gateway's address as training pods reach it (their TRAINSENTRY_GATEWAY_URL, for hang
     triggers): its Service, on the trigger port (gateway.triggerPort), else the gateway's. */}}
{{- define "trainsentry.gatewayUrl" -}}
{{- $g := .Values.gateway -}}
{{- $port := ternary $g.service.triggerPort $g.service.port (gt (int $g.triggerPort) 0) -}}
{{- printf "http://%s.%s.svc:%d" (include "trainsentry.componentName" (dict "ctx" . "component" "gateway")) .Release.Namespace (int $port) -}}
{{- end -}}

{{/* Alertmanager matchers in text form (name="v", name=~"re", and the older match /
     match_re maps) as the CRD's [{name, value, matchType}], in flow-style JSON.
     (dict "matchers" LIST "match" MAP "matchRe" MAP "where" "inhibit_rules") */}}
{{- define "trainsentry.amMatchers" -}}
{{- $re := `^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$` -}}
{{- $out := list -}}
{{- range (.matchers | default list) -}}
{{- if not (regexMatch $re .) -}}
{{- fail (printf "rules/alertmanager-inhibit.yaml %s: cannot parse matcher %q" $.where .) -}}
{{- end -}}
{{- $out = append $out (dict "name" (regexReplaceAll $re . "${1}") "matchType" (regexReplaceAll $re . "${2}") "value" (regexReplaceAll $re . "${3}")) -}}
{{- end -}}
{{- range $k, $v := (.match | default dict) -}}
{{- $out = append $out (dict "name" $k "matchType" "=" "value" (toString $v)) -}}
{{- end -}}
{{- range $k, $v := (.matchRe | default dict) -}}
{{- $out = append $out (dict "name" $k "matchType" "=~" "value" (toString $v)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
Where the operator keeps the jobs' dashboard ConfigMaps when it watches every namespace:
where the chart's own dashboards go (the namespace Grafana's sidecar already watches).
*/}}
{{- define "trainsentry.operatorDashboardsNamespace" -}}
{{- .Values.dashboards.namespace | default .Release.Namespace -}}
{{- end }}

{{/*
The gateway's grants for TrainingJobs' own alert routes (gateway.jobAlerting), each verb for
one reason (docs/operator.md, "Alerting of a job"). Secrets and ConfigMaps are only ever read
in the namespace of the job that references them.
*/}}
{{- define "trainsentry.jobAlertingRules" -}}
# list: find the TrainingJobs and their spec.alerting; get: re-read one before its conditions
# are rewritten (optimistic locking on resourceVersion)
- apiGroups: [trainsentry.io]
  resources: [trainingjobs]
  verbs: [get, list]
# patch: the AlertingReady condition
- apiGroups: [trainsentry.io]
  resources: [trainingjobs/status]
  verbs: [patch]
# get: onCallRosterRef
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
# create: an Event on the job when AlertingReady changes
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{- define "trainsentry.jobAlertingSecretRules" -}}
# get: feishu.webhookSecretRef (the bot's URL and signing secret); never cluster-wide
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
