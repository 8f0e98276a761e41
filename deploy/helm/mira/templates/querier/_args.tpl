{{- define "mira.querierArgs" -}}
- querier
- --data-dir=/data
- --listen=0.0.0.0:3100
- --catalog={{ include "mira.catalogEndpoints" . }}
- --cache-dir=/data/cache
- --cache-size={{ div (mul (include "mira.quantityMiB" .Values.querier.cache.size | int64) 9) 10 }}MiB
{{- include "mira.objectStoreArgs" . }}
{{- include "mira.limitsArgs" . }}
{{- include "mira.securityArgs" (dict "ctx" . "auth" true) | nindent 0 }}
{{- include "mira.extraArgs" .Values.querier.extraArgs }}
{{- end }}

{{- define "mira.querierCacheVolume" -}}
{{- $c := .Values.querier.cache -}}
{{- if eq $c.volume "ephemeral" -}}
- name: cache
  ephemeral:
    volumeClaimTemplate:
      metadata:
        labels:
          {{- include "mira.selectorLabels" (dict "ctx" . "component" "querier") | nindent 10 }}
      spec:
        accessModes: [ReadWriteOnce]
        {{- with $c.storageClass }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $c.size }}
{{- else -}}
- name: cache
  emptyDir:
    sizeLimit: {{ $c.size }}
{{- end -}}
{{- end }}
