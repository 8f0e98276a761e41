{{- define "mira.ingesterArgs" -}}
{{- $fn := include "mira.fullname" . -}}
- ingester
- --data-dir=/data
- --ingester-id=$(POD_NAME)
- --advertise=$(POD_NAME).{{ $fn }}-ingester-headless.$(POD_NAMESPACE).svc.{{ .Values.clusterDomain }}:4317
- --catalog={{ include "mira.catalogEndpoints" . }}
- --grpc-listen=0.0.0.0:4317
- --http-listen=0.0.0.0:4318
- --wal={{ .Values.ingester.wal }}
{{- include "mira.objectStoreArgs" . }}
{{- include "mira.ingestArgs" . }}
{{- include "mira.limitsArgs" . }}
{{- include "mira.securityArgs" (dict "ctx" . "auth" true) | nindent 0 }}
{{- include "mira.extraArgs" .Values.ingester.extraArgs }}
{{- end }}
