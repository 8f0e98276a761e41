{{- define "mira.catalogArgs" -}}
- catalog
- --data-dir=/data
- --listen=0.0.0.0:7400
- --peers={{ include "mira.catalogPeers" . }}
- --cluster-id={{ .Release.Namespace }}/{{ .Release.Name }}
{{- include "mira.securityArgs" (dict "ctx" . "auth" false) | nindent 0 }}
{{- include "mira.extraArgs" .Values.catalog.extraArgs }}
{{- end }}
