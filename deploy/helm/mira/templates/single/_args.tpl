{{- define "mira.singleArgs" -}}
- serve
- --data-dir=/data
- --listen=0.0.0.0:3100
- --grpc-listen=0.0.0.0:4317
- --http-listen=0.0.0.0:4318
- --catalog-listen=0.0.0.0:7400
{{- include "mira.objectStoreArgs" . }}
{{- include "mira.ingestArgs" . }}
{{- include "mira.limitsArgs" . }}
{{- include "mira.securityArgs" (dict "ctx" . "auth" true) | nindent 0 }}
{{- include "mira.extraArgs" .Values.single.extraArgs }}
{{- end }}

{{- define "mira.singlePorts" -}}
- name: http
  containerPort: 3100
  protocol: TCP
- name: otlp-grpc
  containerPort: 4317
  protocol: TCP
- name: otlp-http
  containerPort: 4318
  protocol: TCP
- name: catalog
  containerPort: 7400
  protocol: TCP
{{- end }}
