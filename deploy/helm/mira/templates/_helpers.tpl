{{/*
Names, labels, the image, and the flags every role shares (catalog
members, object store). Selector labels are name + instance + component
only: never a version or the chart, which would make the immutable
selectors of StatefulSets and Deployments change on upgrade.
*/}}

{{- define "mira.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mira.fullname" -}}
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

{{- define "mira.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "querier"). */}}
{{- define "mira.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mira.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every object's labels: (dict "ctx" $ "component" "querier"). */}}
{{- define "mira.labels" -}}
{{ include "mira.selectorLabels" . }}
helm.sh/chart: {{ include "mira.chart" .ctx }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: mira
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels every Mira pod of this release carries (NetworkPolicy peers). */}}
{{- define "mira.releasePodLabels" -}}
app.kubernetes.io/name: {{ include "mira.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mira.distributed" -}}
{{- if eq .Values.mode "distributed" }}true{{ end }}
{{- end }}

{{- define "mira.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.registry -}}
{{ printf "%s/%s:%s" .Values.image.registry .Values.image.repository $tag }}
{{- else -}}
{{ printf "%s:%s" .Values.image.repository $tag }}
{{- end -}}
{{- end }}

{{- define "mira.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mira.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "mira.svcDomain" -}}
{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end }}

{{/* id=address of every catalog member, for --peers. */}}
{{- define "mira.catalogPeers" -}}
{{- $fn := include "mira.fullname" . -}}
{{- $dom := include "mira.svcDomain" . -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.catalog.replicas) -}}
{{- $peers = append $peers (printf "%d=%s-catalog-%d.%s-catalog-headless.%s:7400" $i $fn $i $fn $dom) -}}
{{- end -}}
{{ join "," $peers }}
{{- end }}

{{/* The catalog as its clients reach it (--catalog). */}}
{{- define "mira.catalogEndpoints" -}}
{{- $fn := include "mira.fullname" . -}}
{{- $dom := include "mira.svcDomain" . -}}
{{- if include "mira.distributed" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.catalog.replicas) -}}
{{- $eps = append $eps (printf "%s-catalog-%d.%s-catalog-headless.%s:7400" $fn $i $fn $dom) -}}
{{- end -}}
{{ join "," $eps }}
{{- else -}}
{{ printf "%s.%s:7400" $fn $dom }}
{{- end -}}
{{- end }}

{{/* The Service OTLP goes to, and the one queries go to. */}}
{{- define "mira.otlpService" -}}
{{- if include "mira.distributed" . }}{{ include "mira.fullname" . }}-ingester{{ else }}{{ include "mira.fullname" . }}{{ end }}
{{- end }}

{{- define "mira.queryService" -}}
{{- if include "mira.distributed" . }}{{ include "mira.fullname" . }}-querier{{ else }}{{ include "mira.fullname" . }}{{ end }}
{{- end }}

{{/* The object store URL (empty: filesystem, the data directory's objects/). */}}
{{- define "mira.objectStoreUrl" -}}
{{- $o := .Values.objectStore -}}
{{- if eq $o.type "s3" -}}
s3://{{ $o.s3.bucket }}{{ with $o.s3.prefix }}/{{ trimAll "/" . }}{{ end }}
{{- else if eq $o.type "gcs" -}}
gs://{{ $o.gcs.bucket }}{{ with $o.gcs.prefix }}/{{ trimAll "/" . }}{{ end }}
{{- else if eq $o.type "azure" -}}
az://{{ $o.azure.container }}{{ with $o.azure.prefix }}/{{ trimAll "/" . }}{{ end }}
{{- end -}}
{{- end }}

{{/* object_store options as a sorted key=value list. */}}
{{- define "mira.objectStoreOptions" -}}
{{- $o := .Values.objectStore -}}
{{- $opts := dict -}}
{{- if eq $o.type "s3" -}}
{{- with $o.s3.endpoint }}{{ $_ := set $opts "aws_endpoint" . }}{{ end -}}
{{- with $o.s3.region }}{{ $_ := set $opts "aws_region" . }}{{ end -}}
{{- if $o.s3.allowHttp }}{{ $_ := set $opts "aws_allow_http" "true" }}{{ end -}}
{{- if $o.s3.forcePathStyle }}{{ $_ := set $opts "aws_virtual_hosted_style_request" "false" }}{{ end -}}
{{- else if eq $o.type "gcs" -}}
{{- if $o.gcs.existingSecret }}{{ $_ := set $opts "google_service_account" (printf "/etc/mira/gcs/%s" $o.gcs.existingSecretKey) }}{{ end -}}
{{- else if eq $o.type "azure" -}}
{{- with $o.azure.account }}{{ $_ := set $opts "azure_storage_account_name" . }}{{ end -}}
{{- end -}}
{{- range $k, $v := $o.options }}{{ $_ := set $opts $k (toString $v) }}{{ end -}}
{{- $out := list -}}
{{- range $k := keys $opts | sortAlpha }}{{ $out = append $out (printf "%s=%s" $k (get $opts $k)) }}{{ end -}}
{{ join "," $out }}
{{- end }}

{{/* Object store flags as YAML list items (container args). */}}
{{- define "mira.objectStoreArgs" -}}
{{- with include "mira.objectStoreUrl" . }}
- --object-store={{ . }}
{{- end }}
{{- with include "mira.objectStoreOptions" . }}
- --object-store-option={{ . }}
{{- end }}
{{- end }}

{{/* Credentials of the object store: envFrom items. */}}
{{- define "mira.objectStoreEnvFrom" -}}
{{- $o := .Values.objectStore -}}
{{- if and (eq $o.type "s3") $o.s3.existingSecret }}
- secretRef:
    name: {{ $o.s3.existingSecret }}
{{- else if and (eq $o.type "azure") $o.azure.existingSecret }}
- secretRef:
    name: {{ $o.azure.existingSecret }}
{{- end }}
{{- end }}

{{- define "mira.objectStoreVolumes" -}}
{{- $o := .Values.objectStore -}}
{{- if and (eq $o.type "gcs") $o.gcs.existingSecret }}
- name: gcs-credentials
  secret:
    secretName: {{ $o.gcs.existingSecret }}
{{- end }}
{{- end }}

{{- define "mira.objectStoreVolumeMounts" -}}
{{- $o := .Values.objectStore -}}
{{- if and (eq $o.type "gcs") $o.gcs.existingSecret }}
- name: gcs-credentials
  mountPath: /etc/mira/gcs
  readOnly: true
{{- end }}
{{- end }}

{{/* extraArgs {key: value} as `--key=value` list items; true is a bare flag, false and null are left out. */}}
{{- define "mira.extraArgs" -}}
{{- range $k, $v := . }}
{{- if kindIs "bool" $v }}
{{- if $v }}
- --{{ $k }}
{{- end }}
{{- else if not (kindIs "invalid" $v) }}
- {{ printf "--%s=%v" $k $v | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The flags of the roles that take OTLP (serve, ingester). */}}
{{- define "mira.ingestArgs" -}}
{{- if .Values.tenancy.requireTenant }}
- --require-tenant
{{- end }}
{{- end }}

{{/* A Kubernetes quantity (Ki/Mi/Gi/Ti, or a plain number of bytes) in MiB, rounded down. */}}
{{- define "mira.quantityMiB" -}}
{{- $q := toString . -}}
{{- if hasSuffix "Ti" $q -}}{{ mul (trimSuffix "Ti" $q | int64) 1048576 }}
{{- else if hasSuffix "Gi" $q -}}{{ mul (trimSuffix "Gi" $q | int64) 1024 }}
{{- else if hasSuffix "Mi" $q -}}{{ trimSuffix "Mi" $q | int64 }}
{{- else if hasSuffix "Ki" $q -}}{{ div (trimSuffix "Ki" $q | int64) 1024 }}
{{- else -}}{{ div ($q | int64) 1048576 }}
{{- end -}}
{{- end }}

{{- define "mira.networkPolicyEnabled" -}}
{{- if kindIs "invalid" .Values.networkPolicy.enabled -}}
{{- include "mira.distributed" . -}}
{{- else if .Values.networkPolicy.enabled -}}true{{- end -}}
{{- end }}

{{/* The Secret holding the cluster secret. */}}
{{- define "mira.clusterSecretName" -}}
{{- default (printf "%s-cluster" (include "mira.fullname" .)) .Values.security.clusterSecret.existingSecret -}}
{{- end }}

{{/* The kubernetes.io/tls Secret of every port (security.tls). */}}
{{- define "mira.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "mira.fullname" .)) .Values.security.tls.secretName -}}
{{- end }}

{{/* http or https: the scheme of every Mira URL the chart writes. */}}
{{- define "mira.scheme" -}}
{{- if .Values.security.tls.enabled }}https{{ else }}http{{ end -}}
{{- end }}

{{/*
Security flags of a role, as YAML list items: (dict "ctx" $ "auth" true).
Every role sends and requires the cluster secret and, with TLS, serves
its ports with the certificate and trusts ca.crt on its internal calls;
"auth" roles (serve, ingester, querier, compactor) also authenticate
their external ports.
*/}}
{{- define "mira.securityArgs" -}}
{{- $s := .ctx.Values.security -}}
- --cluster-secret-file=/etc/mira/cluster/{{ $s.clusterSecret.key }}
{{- if $s.tls.enabled }}
- --tls-cert=/etc/mira/tls/tls.crt
- --tls-key=/etc/mira/tls/tls.key
- --tls-ca=/etc/mira/tls/ca.crt
{{- end }}
{{- if .auth }}
{{- if ne $s.auth.mode "none" }}
- --auth={{ $s.auth.mode }}
{{- end }}
{{- if eq $s.auth.mode "tokens" }}
- --auth-tokens-file=/etc/mira/tokens/{{ $s.auth.tokensKey }}
{{- else if eq $s.auth.mode "trusted-header" }}
- --auth-trusted-proxies={{ join "," $s.auth.trustedProxies }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret volumes securityArgs reads: (dict "ctx" $ "auth" true). */}}
{{- define "mira.securityVolumes" -}}
{{- $s := .ctx.Values.security -}}
- name: cluster-secret
  secret:
    secretName: {{ include "mira.clusterSecretName" .ctx }}
    defaultMode: 0440
{{- if $s.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "mira.tlsSecretName" .ctx }}
    defaultMode: 0440
{{- end }}
{{- if and .auth (eq $s.auth.mode "tokens") }}
- name: auth-tokens
  secret:
    secretName: {{ $s.auth.tokensSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "mira.securityVolumeMounts" -}}
{{- $s := .ctx.Values.security -}}
- name: cluster-secret
  mountPath: /etc/mira/cluster
  readOnly: true
{{- if $s.tls.enabled }}
- name: tls
  mountPath: /etc/mira/tls
  readOnly: true
{{- end }}
{{- if and .auth (eq $s.auth.mode "tokens") }}
- name: auth-tokens
  mountPath: /etc/mira/tokens
  readOnly: true
{{- end }}
{{- end }}

{{/* Grafana data sources: jsonData and secureJsonData items of the tenant and credentials. */}}
{{- define "mira.grafanaJsonData" -}}
{{- $g := .Values.grafana.datasources -}}
{{- if $g.tenant }}
httpHeaderName1: X-Scope-OrgID
{{- end }}
{{- if $g.credentials.caFile }}
tlsAuthWithCACert: true
{{- end }}
{{- end }}
{{- define "mira.grafanaSecure" -}}
{{- $g := .Values.grafana.datasources -}}
{{- if or $g.tenant $g.credentials.tokenFile $g.credentials.caFile }}
secureJsonData:
  {{- if $g.tenant }}
  httpHeaderValue1: {{ $g.tenant | quote }}
  {{- end }}
  {{- with $g.credentials.tokenFile }}
  basicAuthPassword: {{ printf "$__file{%s}" . | quote }}
  {{- end }}
  {{- with $g.credentials.caFile }}
  tlsCACert: {{ printf "$__file{%s}" . | quote }}
  {{- end }}
{{- end }}
{{- end }}

{{/* Whether the chart renders a limits file. */}}
{{- define "mira.limitsEnabled" -}}
{{- $on := .Values.limits.tenants -}}
{{- range $k, $v := .Values.limits.defaults }}
{{- if not (has (toString $v) (list "0" "0s" "")) }}{{ $on = true }}{{ end }}
{{- end }}
{{- if $on }}true{{ end -}}
{{- end }}

{{/* One table of the limits file: numbers as integers, sizes and durations quoted. */}}
{{- define "mira.limitsKeys" -}}
{{- range $k, $v := . }}
{{- if kindIs "string" $v }}
{{ $k }} = {{ $v | quote }}
{{- else }}
{{ $k }} = {{ $v | int64 }}
{{- end }}
{{- end }}
{{- end }}

{{/* The --limits-file flag (serve, ingester, querier), as a YAML list item. */}}
{{- define "mira.limitsArgs" -}}
{{- if include "mira.limitsEnabled" . }}
- --limits-file=/etc/mira/limits/limits.toml
{{- end }}
{{- end }}
