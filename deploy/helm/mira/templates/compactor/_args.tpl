{{- define "mira.compactorArgs" -}}
- compactor
- --data-dir=/data
- --compactor-listen=0.0.0.0:7600
- --compactor-id=$(POD_NAME)
- --catalog={{ include "mira.catalogEndpoints" . }}
{{- include "mira.objectStoreArgs" . }}
{{- range $name, $url := .Values.compactor.offload.targets }}
- --offload-target={{ $name }}={{ $url }}
{{- end }}
{{- include "mira.securityArgs" (dict "ctx" . "auth" true) | nindent 0 }}
{{- include "mira.extraArgs" .Values.compactor.extraArgs }}
{{- end }}
