{{/*
The one pod template every workload uses, so `defaults` reach all of them.
Arguments (a dict):
  ctx        the root context
  component  catalog | ingester | querier | compactor | operator | single
  values     the component's values block
  args       container args (a YAML list, as text)
  ports      container ports (YAML list text)
  probePort  the port name /ready and /live are asked on
  env        extra env items (YAML list text), optional
  envFrom    extra envFrom items (YAML list text), optional
  volumes    volumes (YAML list text), optional
  mounts     volumeMounts (YAML list text), optional
  grace      terminationGracePeriodSeconds, optional
  startup    failureThreshold of the startup probe (10 s apart), optional
  objectStore  true: the object store's credentials are mounted
  auth       true: the role authenticates external ports (the tokens file is mounted)
  limits     true: the role enforces per-tenant limits (the limits file is mounted)
Every pod mounts the cluster secret and, with security.tls, the TLS Secret
(mira.securityVolumes); its probes use HTTPS then.
*/}}
{{- define "mira.podTemplate" -}}
{{- $ctx := .ctx -}}
{{- $d := $ctx.Values.defaults -}}
{{- $v := .values -}}
metadata:
  labels:
    {{- include "mira.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
    app.kubernetes.io/part-of: mira
    {{- with (merge (dict) ($v.podLabels | default dict) $d.podLabels) }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with (merge (dict) ($v.podAnnotations | default dict) $d.podAnnotations) }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ .serviceAccountName | default (include "mira.serviceAccountName" $ctx) }}
  {{- with $ctx.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with ($v.priorityClassName | default $d.priorityClassName) }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .grace }}
  terminationGracePeriodSeconds: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml ($v.podSecurityContext | default $d.podSecurityContext) | nindent 4 }}
  {{- with ($v.nodeSelector | default $d.nodeSelector) }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with ($v.tolerations | default $d.tolerations) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with ($v.affinity | default $d.affinity) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $spread := $v.topologySpreadConstraints | default $d.topologySpreadConstraints }}
  {{- if eq (toString $spread) "soft" }}
  topologySpreadConstraints:
    {{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
    - maxSkew: 1
      topologyKey: {{ $key }}
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "mira.selectorLabels" (dict "ctx" $ctx "component" $.component) | nindent 10 }}
    {{- end }}
  {{- else if kindIs "slice" $spread }}
  topologySpreadConstraints:
    {{- toYaml $spread | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .component }}
      image: {{ include "mira.image" $ctx }}
      imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
      args:
        {{- .args | nindent 8 }}
      ports:
        {{- .ports | nindent 8 }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- with .env }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with (concat ($v.extraEnv | default list) $d.extraEnv) }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $envFrom := concat ($v.extraEnvFrom | default list) $d.extraEnvFrom }}
      {{- $storeEnvFrom := "" }}
      {{- if .objectStore }}{{ $storeEnvFrom = include "mira.objectStoreEnvFrom" $ctx }}{{ end }}
      {{- if or $envFrom $storeEnvFrom .envFrom }}
      envFrom:
        {{- with $storeEnvFrom }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with .envFrom }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with $envFrom }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      startupProbe:
        httpGet:
          scheme: {{ upper (include "mira.scheme" $ctx) }}
          path: /live
          port: {{ .probePort }}
        periodSeconds: 10
        failureThreshold: {{ .startup | default 30 }}
      livenessProbe:
        httpGet:
          scheme: {{ upper (include "mira.scheme" $ctx) }}
          path: /live
          port: {{ .probePort }}
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 6
      readinessProbe:
        httpGet:
          scheme: {{ upper (include "mira.scheme" $ctx) }}
          path: /ready
          port: {{ .probePort }}
        periodSeconds: 5
        timeoutSeconds: 5
        failureThreshold: 3
      resources:
        {{- toYaml ($v.resources | default $d.resources) | nindent 8 }}
      securityContext:
        {{- toYaml ($v.containerSecurityContext | default $d.containerSecurityContext) | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- include "mira.securityVolumeMounts" (dict "ctx" $ctx "auth" .auth) | nindent 8 }}
        {{- if and .limits (include "mira.limitsEnabled" $ctx) }}
        - name: limits
          mountPath: /etc/mira/limits
          readOnly: true
        {{- end }}
        {{- with .mounts }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- if .objectStore }}
        {{- include "mira.objectStoreVolumeMounts" $ctx | nindent 8 }}
        {{- end }}
        {{- with (concat ($v.extraVolumeMounts | default list) $d.extraVolumeMounts) }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- include "mira.securityVolumes" (dict "ctx" $ctx "auth" .auth) | nindent 4 }}
    {{- if and .limits (include "mira.limitsEnabled" $ctx) }}
    - name: limits
      configMap:
        name: {{ include "mira.fullname" $ctx }}-limits
    {{- end }}
    {{- with .volumes }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- if .objectStore }}
    {{- include "mira.objectStoreVolumes" $ctx | nindent 4 }}
    {{- end }}
    {{- with (concat ($v.extraVolumes | default list) $d.extraVolumes) }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
A PodDisruptionBudget, only when more than one replica can run:
(dict "ctx" $ "component" "querier" "values" .Values.querier "replicas" N)
*/}}
{{- define "mira.pdb" -}}
{{- $pdb := .values.podDisruptionBudget -}}
{{- if and $pdb.enabled (gt (int .replicas) 1) }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "mira.fullname" .ctx }}-{{ .component }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "mira.labels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
spec:
  maxUnavailable: {{ $pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "mira.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 6 }}
{{- end }}
{{- end }}

{{/*
A ServiceMonitor for one component's Service:
(dict "ctx" $ "component" "querier" "service" "name" "port" "http")
*/}}
{{- define "mira.serviceMonitor" -}}
{{- $sm := .ctx.Values.serviceMonitor -}}
{{- if $sm.enabled }}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "mira.fullname" .ctx }}-{{ .component }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "mira.labels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
    {{- with $sm.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  namespaceSelector:
    matchNames: [{{ .ctx.Release.Namespace }}]
  selector:
    matchLabels:
      {{- include "mira.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 6 }}
      mira.dev/service: {{ .service }}
  endpoints:
    - port: {{ .port }}
      path: /metrics
      {{- with $sm.interval }}
      interval: {{ . }}
      {{- end }}
      {{- with $sm.scrapeTimeout }}
      scrapeTimeout: {{ . }}
      {{- end }}
      {{- with $sm.relabelings }}
      relabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $sm.metricRelabelings }}
      metricRelabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
{{- end }}
